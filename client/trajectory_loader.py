"""Reading one finished (or unfinished) trajectory turn by turn from its workflow's history and the payload store.

The workflow's result gives the turn keys and reward, its history every activity's decoded input and result (and the
worker that ran it), the store each turn's token ids and logprobs; `load_trajectory` joins them into a
`TrajectoryView`. A trajectory `<id>-<n>` may be a member of the group or batch workflow `<id>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from rollart.client.trajectory_view import ROLLOUT_WORKFLOWS, CallInfo, TrajectoryView, TurnView, summarize_logprobs
from rollart.client.unit_history import unit_input, unit_results
from rollart.contracts.activities import (
    EnvHandle,
    GroupHandle,
    GroupResetInput,
    GroupStepInput,
    ResetInput,
    RestoreInput,
    RewardBatchInput,
    RewardInput,
    RewardResult,
    StepInput,
    StepResult,
    Transcript,
)
from rollart.contracts.generation import GenerateBatchInput, GenerateInput, GenerateResult
from rollart.contracts.rollouts import (
    BatchRolloutInput,
    GroupRolloutInput,
    TrajectoryInput,
    TrajectoryResult,
)
from rollart.contracts.store import StoredTurn
from rollart.infra.store.keys import key_word
from rollart.infra.store.payload import Store, StoreError
from rollart.infra.temporal.history import ActivitySpan, activity_spans
from rollart.spec.routing import Unit, unit_of

__all__ = ["TrajectoryNotFound", "load_trajectory", "workflow_candidates"]

_INPUTS: dict[str, Any] = {
    "reset": ResetInput,
    "reset_group": GroupResetInput,
    "restore": RestoreInput,
    "generate": GenerateInput,
    "generate_batch": GenerateBatchInput,
    "step": StepInput,
    "step_group": GroupStepInput,
    "reward": RewardInput,
    "reward_batch": RewardBatchInput,
}
_RESULTS: dict[str, Any] = {
    "reset": EnvHandle,
    "reset_group": GroupHandle,
    "restore": GroupHandle,
    "generate": GenerateResult,
    "generate_batch": list[GenerateResult],
    "step": StepResult,
    "step_group": list[StepResult | None],
    "check": list[list[StepResult]],
    "reward": RewardResult,
    "reward_batch": list[RewardResult],
}


class TrajectoryNotFound(LookupError):
    """No workflow of the server holds a trajectory of this id."""


def workflow_candidates(trajectory_id: str) -> list[str]:
    """The workflows that may hold `trajectory_id`: its own, then the group or batch it is member `-<n>` of."""
    parent = re.sub(r"-\d+$", "", trajectory_id)
    return [trajectory_id] if parent == trajectory_id else [trajectory_id, parent]


async def load_trajectory(client: Client, trajectory_id: str, store: Store | None) -> TrajectoryView:
    """Everything recorded about one trajectory; TrajectoryNotFound when no workflow holds it."""
    for wid in workflow_candidates(trajectory_id):
        handle = client.get_workflow_handle(wid)
        try:
            desc = await handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                continue
            raise
        if desc.workflow_type not in ROLLOUT_WORKFLOWS:
            continue
        history = await client.get_workflow_handle(wid, run_id=desc.run_id).fetch_history()
        view = await _view(client, history, desc.workflow_type, trajectory_id, store)
        if view is not None:
            return view
    raise TrajectoryNotFound(trajectory_id)


async def _view(
    client: Client, history: WorkflowHistory, wf_type: str, tid: str, store: Store | None
) -> TrajectoryView | None:
    decode = client.data_converter.decode
    wf_input = await unit_input(client, history, wf_type)
    results = await unit_results(client, list(history.events))
    status, error = "running", None
    for e in history.events:
        if e.HasField("workflow_execution_completed_event_attributes"):
            status = "completed"
        elif e.HasField("workflow_execution_failed_event_attributes"):
            status, error = "failed", e.workflow_execution_failed_event_attributes.failure.message
        elif e.HasField("workflow_execution_terminated_event_attributes"):
            status, error = "terminated", e.workflow_execution_terminated_event_attributes.reason
        elif e.HasField("workflow_execution_timed_out_event_attributes"):
            status = "timed out"
        elif e.HasField("workflow_execution_canceled_event_attributes"):
            status = "canceled"
    result = next((r for r in results if r.trajectory_id == tid), None)
    if result is None and not _holds(wf_type, wf_input, history.workflow_id, tid):
        return None
    calls = await _calls(decode, history)
    turns, final = _turns(calls, result, tid, wf_input, store)
    return TrajectoryView(
        trajectory_id=tid,
        workflow_id=history.workflow_id,
        run_id=history.events[0].workflow_execution_started_event_attributes.original_execution_run_id,
        workflow_type=wf_type,
        workflow_status=status,
        result=result,
        turns=turns,
        final_observation=final,
        error=(result.error if result else None) or error,
        calls=[CallInfo.of(c.span) for c in calls],
    )


def _holds(wf_type: str, wf_input: Any, workflow_id: str, tid: str) -> bool:
    """Whether an unfinished (or failed) workflow holds `tid`: from its input."""
    if isinstance(wf_input, TrajectoryInput):
        return (wf_input.trajectory_id or workflow_id) == tid
    if isinstance(wf_input, GroupRolloutInput):
        return any(tid in g.members(wf_input.task.group_size) for g in wf_input.groups)
    if isinstance(wf_input, BatchRolloutInput):
        return any(t.trajectory_id == tid for t in wf_input.trajectories)
    return False


@dataclass(frozen=True)
class _Call:
    span: ActivitySpan
    input: Any
    result: Any


async def _decoded(decode: Any, payloads: Any, type_: Any) -> Any:
    if not payloads:
        return None
    try:
        (value,) = await decode(payloads, [type_])
        return value
    except (
        ValueError,
        TypeError,
        RuntimeError,
        KeyError,
    ):  # a payload of another shape (an older or newer contract): shown without it
        return None


async def _calls(decode: Any, history: WorkflowHistory) -> list[_Call]:
    """Every activity with its decoded input and (when it succeeded) result, in schedule order."""
    inputs: list[Any] = []
    results: dict[int, Any] = {}
    order: list[int] = []
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            order.append(e.event_id)
            inputs.append((a.activity_type.name, a.input.payloads))
        elif e.HasField("activity_task_completed_event_attributes"):
            a = e.activity_task_completed_event_attributes
            results[a.scheduled_event_id] = a.result.payloads
    calls = []
    for span, sid, (name, payloads) in zip(activity_spans(history), order, inputs):
        inp = await _decoded(decode, payloads, _INPUTS[name]) if name in _INPUTS else None
        res = await _decoded(decode, results[sid], _RESULTS[name]) if sid in results and name in _RESULTS else None
        calls.append(_Call(span, inp, res))
    return calls


def _turns(
    calls: list[_Call], r: TrajectoryResult | None, tid: str, wf_input: Any, store: Store | None
) -> tuple[list[TurnView], str]:
    """Each turn from its generation (by turn key), its step (by session) and the reward's transcript."""
    gens: dict[str, tuple[_Call, str, GenerateResult | None]] = {}  # turn key → call, prompt, result
    for c in calls:
        if isinstance(c.input, GenerateInput):
            gens[c.input.data_key] = (c, c.input.prompt, c.result)
        elif isinstance(c.input, GenerateBatchInput):
            for j, (key, prompt) in enumerate(zip(c.input.data_keys, c.input.prompts)):
                gens[key] = (c, prompt, c.result[j] if c.result and j < len(c.result) else None)
    keys = list(r.turn_keys) if r else [k for k in gens if f"/{key_word(tid)}/turn-" in k]
    index = r.completion_index if r else 0
    steps = _steps(calls, tid, wf_input)
    prompts, actions = [], []
    for key in keys:
        _, prompt, gen = gens.get(key, (None, "", None))
        prompts.append(prompt)
        actions.append(gen.completions[index].text if gen and index < len(gen.completions) else "")
    transcript = _transcript(calls, prompts, actions)
    turns = []
    for i, key in enumerate(keys):
        call, _, gen = gens.get(key, (None, "", None))
        rec = transcript.turns[i] if transcript and i < len(transcript.turns) else None
        step_call, step = steps[i] if i < len(steps) else (None, None)
        stored, note = _stored(store, key)
        comp = stored.completions[index] if stored and index < len(stored.completions) else None
        gc = gen.completions[index] if gen and index < len(gen.completions) else None
        turns.append(
            TurnView(
                index=i,
                observation=rec.observation if rec else prompts[i],
                action=rec.action if rec else actions[i],
                data_key=key,
                env_reward=rec.env_reward if rec else step.reward if step else None,
                done=rec.done if rec else step.done if step else None,
                info=dict(rec.info if rec else step.info if step else {}),
                prompt_tokens=len(stored.prompt_ids) if stored else gen.prompt_tokens if gen else None,
                completion_tokens=len(comp.token_ids) if comp else gc.num_tokens if gc else None,
                finish_reason=comp.finish_reason if comp else gc.finish_reason if gc else None,
                policy_version=stored.policy_version if stored else gen.policy_version if gen else None,
                policy_version_end=stored.policy_version_end if stored else gen.policy_version_end if gen else None,
                logprobs=summarize_logprobs(comp.logprobs) if comp else None,
                generate=CallInfo.of(call.span) if call else None,
                step=CallInfo.of(step_call.span) if step_call else None,
                store_note=note,
            )
        )
    final = transcript.final_observation if transcript else steps[-1][1].observation if steps and steps[-1][1] else ""
    return turns, final


def _steps(calls: list[_Call], tid: str, wf_input: Any) -> list[tuple[_Call, StepResult | None]]:
    """The env calls that played each turn of `tid`, in order, with what the env answered to it."""
    owner, member = tid, 0
    if isinstance(wf_input, GroupRolloutInput):
        for g in wf_input.groups:
            members = g.members(wf_input.task.group_size)
            if tid in members:
                owner, member = g.group_id, members.index(tid)
        if unit_of(wf_input.task) is Unit.SINGLE_TURN_WAVE:  # one `check` for all of them
            return [(c, None) for c in calls if c.span.activity_type == "check" and c.span.succeeded][:1]
    sessions = set()
    for c in calls:
        if (
            (isinstance(c.input, ResetInput) and c.input.trajectory_id == owner and c.result)
            or (isinstance(c.input, GroupResetInput) and c.input.group_id == owner and c.result)
            or (isinstance(c.input, RestoreInput) and c.input.owner_id == owner and c.result)
        ):
            sessions.add(c.result.session_id)
    steps: list[tuple[_Call, StepResult | None]] = []
    for c in calls:
        if not c.span.succeeded or getattr(c.input, "session_id", None) not in sessions:
            continue
        if isinstance(c.input, StepInput):
            steps.append((c, c.result))
        elif (
            isinstance(c.input, GroupStepInput)
            and member < len(c.input.actions)
            and c.input.actions[member] is not None
        ):
            steps.append((c, c.result[member] if c.result and member < len(c.result) else None))
    return steps


def _transcript(calls: list[_Call], prompts: list[str], actions: list[str]) -> Transcript | None:
    """The transcript the reward was given for this trajectory: the one with its prompts and actions."""
    for c in calls:
        scripts = (
            [c.input.transcript]
            if isinstance(c.input, RewardInput)
            else (c.input.transcripts if isinstance(c.input, RewardBatchInput) else [])
        )
        for t in scripts:
            if [x.action for x in t.turns] == actions and [x.observation for x in t.turns][:1] == prompts[:1]:
                return t
    return None


def _stored(store: Store | None, key: str) -> tuple[StoredTurn | None, str | None]:
    if store is None:
        return None, "no store"
    try:
        return StoredTurn.from_bytes(store.get(key)), None
    except (
        StoreError,
        ValueError,
        OSError,
    ) as e:  # a key the store lost or never had: the turn is shown from history alone
        return None, f"not in the store: {type(e).__name__}"
