"""The vLLM releases arc_cy verified, printed by tools/fingerprint.py after
tools/vllm_compat.sh passed: FILES, one SHA-256 of each release's judged
files as it ships them (files.digest; each file's: tests/data/vllm/record.json);
ARC, each object of ARC's code -> {fingerprint: the releases that ship it};
USES, each use of a policy by a release's callers -> those releases;
SUPPORTED_VLLM, what the [vllm] extra installs."""

SUPPORTED_VLLM = ">=0.30.0,<0.35"
FILES: dict[str, str] = {
    "0.30.0": "efebc5e47eccf1c064320817e4b86cb7ff03c5a6a2db16a9439d280c9a0dc361",
    "0.31.0": "de951da8e92155870e5102de5c0870afde9eff74a30ba7cee5653db180c43af8",
    "0.32.0": "37bea41302f0315385847f0d9e31fd6b2d38ac500337a0d70b06dcb215c03e67",
    "0.33.0": "a40ce637715654950c7c6c8be5d1644d8f1e6154de397bfdf03ea57384698830",
    "0.34.0": "888e2b51bea38f1e2f0ba8e495588b2bf7ec1570b3f731a360b9821a2c6835a4",
}
ARC: dict[str, dict[str, str]] = {
    "arc.py:ARCCachePolicy": {"12ac272a1b27": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ARCCachePolicy.__init__": {"2ab9b13ecba3": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ARCCachePolicy._adapt_to_ghost_hit": {"97038f629d0d": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ARCCachePolicy.clear": {"c291a755e32b": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ARCCachePolicy.evict": {"1a67047d336a": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ARCCachePolicy.get": {"57da6cc71049": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ARCCachePolicy.insert": {
        "10af08e4dd60": "0.30.0 0.31.0 0.32.0",
        "fd41faf53531": "0.33.0 0.34.0",
    },
    "arc.py:ARCCachePolicy.on_request_finished": {"e1f2ef266a20": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ARCCachePolicy.on_store_miss": {"9b2780760207": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ARCCachePolicy.remove": {"4a9cb25a7f0f": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ARCCachePolicy.touch": {
        "6f866c714717": "0.30.0",
        "c2c812fcac74": "0.31.0 0.32.0 0.33.0",
    },
    "arc.py:CachePolicy": {"2391f93bf24a": "0.30.0", "335501fbf3c4": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ChunkStatus": {"2391f93bf24a": "0.30.0", "335501fbf3c4": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:Iterable": {"54a764e20cd1": "0.30.0", "1c5a7dc93a71": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:Iterator": {"54a764e20cd1": "0.30.0", "1c5a7dc93a71": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:OffloadKey": {"06a327707cad": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:OrderedDict": {"f44bdbb8a221": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:ReqContext": {"06a327707cad": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:Sequence": {"1c5a7dc93a71": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:order_request_keys": {"335501fbf3c4": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "arc.py:override": {"079b24ef7b01": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:ABC": {"4b90820bfe61": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:CachePolicy": {"fb5fc6113d7b": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:CachePolicy.__init__": {"eac855253847": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:CachePolicy.mark_evictable": {"933e2458c6b8": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:CachePolicy.mark_non_evictable": {
        "19e6effae257": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    },
    "base.py:CachePolicy.on_request_access": {"4b3ce7715395": "0.33.0 0.34.0"},
    "base.py:ChunkStatus": {"307b0d52d05c": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:Iterable": {"0aef2759eb22": "0.30.0", "532eadc17395": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:OffloadKey": {"06a327707cad": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:ReqContext": {"06a327707cad": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:Sequence": {"532eadc17395": "0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:abstractmethod": {"4b90820bfe61": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:ctypes": {"cf1b9fdd2853": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0"},
    "base.py:order_request_keys": {"9b8851c0e936": "0.31.0 0.32.0 0.33.0 0.34.0"},
}
USES: dict[str, str] = {
    "call:__init__": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    "call:clear": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    "call:evict": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    "call:get": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    "call:insert": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    "call:mark_evictable": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    "call:mark_non_evictable": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    "call:on_request_access": "0.33.0 0.34.0",
    "call:on_request_finished": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    "call:on_store_miss": "0.31.0 0.32.0 0.33.0 0.34.0",
    "call:remove": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    "call:touch": "0.30.0 0.31.0 0.32.0 0.33.0",
    "keyword:cache_capacity": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
    "string:lru": "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0",
}
