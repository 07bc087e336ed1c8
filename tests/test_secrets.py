"""The worker's secrets stay out of what it records: an env's observations (what model-written code printed) and an
agent program's error output are scrubbed of them, and an agent command gets a secret by the worker variable's name,
never as a value in the job (infra/secrets.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from temporalio.exceptions import ApplicationError

from rollart.activities.agent_program import AgentActivities
from rollart.activities.env_calls import step_result
from rollart.infra.secrets import REDACTED, remember_file, scrub
from rollart.spec.chat import ChatMessage
from rollart.spec.config.agent import AgentArgs

API_KEY = "tmprl-api-key-0123456789abcdef"
PEM = (
    "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
    "-----END PRIVATE KEY-----\n"
)


@pytest.mark.unit
def test_the_workers_secrets_are_scrubbed_and_where_they_are_is_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TEMPORAL_API_KEY", API_KEY)
    monkeypatch.setenv("TEMPORAL_TLS_KEY_PATH", "/etc/rollart/tls/client.key")  # where a secret is: not one
    key = tmp_path / "client.key"
    key.write_text(PEM)
    remember_file(key)
    printed = f"env: {API_KEY}\nkey at /etc/rollart/tls/client.key\n{PEM}"
    out = scrub(printed)
    assert (
        API_KEY not in out
        and "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" not in out
        and "BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj" not in out
    )
    assert "/etc/rollart/tls/client.key" in out and out.count(REDACTED) >= 2
    assert scrub("a line of the key: BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj") == f"a line of the key: {REDACTED}"


@pytest.mark.unit
def test_a_step_records_the_observation_and_messages_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a tool printed (its output is the observation) is recorded without the worker's secrets."""
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    entry = SimpleNamespace(name="tool_use")
    text = step_result(
        entry, SimpleNamespace(observation="leaked hf_abcdefghijklmnop", reward=0.0, done=False, info={})
    )
    assert text.observation == f"leaked {REDACTED}"
    message = ChatMessage(role="tool", content="token=hf_abcdefghijklmnop")
    chat = step_result(entry, SimpleNamespace(observation=[message], reward=0.0, done=False, info={}))
    assert chat.messages is not None and chat.messages[0].content == f"token={REDACTED}"


PRINTS_ITS_SECRETS = (
    "import os, sys; sys.stderr.write(os.environ['HUB_TOKEN'] + ' ' + os.environ['OPENAI_API_KEY']); sys.exit(3)"
)


@pytest.mark.integration
def test_a_command_gets_a_secret_by_name_and_its_output_is_recorded_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`env_args.env: {HUB_TOKEN: {from_env: WORKER_HUB_TOKEN}}`: the job names the worker's variable, the program
    gets its value; the program printing it (and its endpoint key) leaves `[redacted]` in its failure."""
    monkeypatch.setenv("WORKER_HUB_TOKEN", "hub-secret-value-42")
    args = AgentArgs.parse(
        {"command": [sys.executable, "-c", PRINTS_ITS_SECRETS], "env": {"HUB_TOKEN": {"from_env": "WORKER_HUB_TOKEN"}}}
    )
    agents = AgentActivities(client=None)  # type: ignore[arg-type]  # `_command` needs no Temporal
    with pytest.raises(ApplicationError) as failed:
        asyncio.run(agents._command(args, "http://127.0.0.1:1/t/x/v1", 0, "endpoint-key-abcdefgh"))
    assert "exited 3" in failed.value.message and failed.value.message.endswith(f"{REDACTED} {REDACTED}")
    assert "hub-secret-value-42" not in failed.value.message and "endpoint-key-abcdefgh" not in failed.value.message
    monkeypatch.delenv("WORKER_HUB_TOKEN")
    with pytest.raises(ApplicationError, match="the worker's variable WORKER_HUB_TOKEN, which is not set") as missing:
        asyncio.run(agents._command(args, "http://127.0.0.1:1/t/x/v1", 0, "endpoint-key-abcdefgh"))
    assert missing.value.type == "InvalidInput"
