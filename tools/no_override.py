"""What a user of the installed vLLM gets from arc_cy with no override:
the plugin registers ``arc_cy``, ``cache_policy_module_path`` builds the
manager, and ``python -m arc_cy`` exits 0. tools/vllm_compat.sh ends with it,
run outside the checkout with the override unset. Exits 1, naming the
guard's reasons, if any of the three fails."""

from __future__ import annotations

import os
import subprocess
import sys

import vllm.plugins
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

from arc_cy._guard import refused_message, verified_message, vllm_guard

for name in ("ARC_CY_ALLOW_UNVERIFIED_VLLM", "ARC_CY_IGNORE_VLLM_VERSION"):
    os.environ.pop(name, None)  # read when the guard decides, below
code = vllm_guard.result()
failed = []
vllm.plugins.load_general_plugins()
try:
    CachePolicyFactory.get_cache_policy_cls("arc_cy")
    print("no override: the plugin registered 'arc_cy'")
except ValueError as exc:
    failed.append(f"the plugin did not register 'arc_cy' ({exc})")
try:
    CPUOffloadingManager(
        num_chunks=4, cache_policy="ARCCachePolicy", cache_policy_module_path="arc_cy"
    )
    print("no override: cache_policy_module_path='arc_cy' built the manager")
except RuntimeError as exc:
    failed.append(f"cache_policy_module_path='arc_cy' did not build the manager ({exc})")
report = subprocess.run([sys.executable, "-P", "-m", "arc_cy"], capture_output=True, text=True)
vllm_line = next((ln for ln in report.stdout.splitlines() if ln.startswith("vLLM: ")), "")
if report.returncode == 0:
    print(f"no override: python -m arc_cy exited 0 ({vllm_line})")
else:
    failed.append(f"python -m arc_cy exited {report.returncode} ({vllm_line})")
if failed:
    print("no override: FAILED: " + "; ".join(failed))
    if code is not None and not code.ok:
        print(f"the guard: {refused_message(code)}")
        print("Add the table printed above to arc_cy/_guard/verified.py, reinstall, and rerun.")
    sys.exit(1)
assert code is not None
print(f"no override: vLLM {code.version}: {verified_message(code)}")
