"""What a job declares, and the rules it must pass: the bottom room of rollart.

- `config/`: the job spec, section by section (pydantic), loaded and resolved (`load_job`);
- `pools`, `routing`, `placement`, `hardware`: the hardware pools, which queue each piece of work goes to, and
  which generation pool each task's turns should use (from the GPUs' rooflines or measured rates);
- `env`, `chat`: the contract a user's env implements and the chat messages it speaks;
- `registry`, `imports`: the `@env` / `@reward` declarations and the import paths a job may name;
- `checks`: the last level of validation, which builds every env and reward the job names.

It imports no other room (the import contracts in pyproject.toml hold it): contracts, workflows, activities,
workers and the client all read the spec, never the other way round. A user imports from `rollart.sdk`.
"""
