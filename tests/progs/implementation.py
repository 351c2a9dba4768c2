"""Prints which implementation `import arc_cy` chose and the module of its
ARCCachePolicy (ARC_CY_NO_EXTENSIONS comes from the environment).
--no-vllm: without vLLM (_child reads it)."""

import _child  # noqa: F401 -- imported for --no-vllm

import arc_cy

print(arc_cy.IMPLEMENTATION, arc_cy.ARCCachePolicy.__module__)
