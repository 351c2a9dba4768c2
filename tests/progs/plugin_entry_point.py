"""vLLM's general plugins loaded twice and arc_cy's register() called
again in a fresh process, then a CPUOffloadingManager with
cache_policy="arc_cy": prints its policy's module, or "not registered"
where the plugin registered nothing (and vLLM's loader did not raise)."""

import vllm.plugins

import arc_cy.plugin

vllm.plugins.load_general_plugins()
vllm.plugins.load_general_plugins()
arc_cy.plugin.register()
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402 -- after the plugins load
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory  # noqa: E402 -- after the plugins load

if "arc_cy" not in CachePolicyFactory._registry:
    print("not registered")
else:
    m = CPUOffloadingManager(num_chunks=2, cache_policy="arc_cy")
    print(type(m._policy).__module__)
