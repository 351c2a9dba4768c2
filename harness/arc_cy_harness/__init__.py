"""What arc_cy's tests (tests/, engine_tests/) and benchmarks (bench/) share,
and the modules they hand to vLLM by name. Not part of arc_cy: it is found
on ``harness/``, which pytest (pyproject.toml's ``pythonpath``),
bench/run.sh and the engine drivers put on the path.

Handed to vLLM as ``spec_module_path`` or ``cache_policy_module_path``:

- ``arc_cy_harness.offload_stub``: an offloading spec whose worker completes
  every transfer at once (vLLM's real scheduler, no GPU);
- ``arc_cy_harness.cpu_offload``: vLLM's CPU spec with a worker that copies
  KV blocks on the CPU and checks every load against what was stored;
- ``arc_cy_harness.engine_lockstep``: vLLM's ARC and arc_cy side by side in
  one engine, compared at every call;
- ``arc_cy_harness.engine_timing``: a policy wrapper that times each call.

The rest: ``traffic`` (manager-shaped traffic on several policies at
once), ``chat_workload`` and ``multi_turn_workload`` (workloads),
``engine_run`` (one engine process), ``vllm_overlay`` (a vLLM with one
line of its ARC changed, or another version).
"""
