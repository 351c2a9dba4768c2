"""The vLLM releases arc_cy verified, printed by tools/fingerprint.py after
tools/vllm_compat.sh passed: FILES, each judged file's SHA-256 as the
release ships it (tests/data/vllm/record.json's); ARC, each object of ARC's
code -> {fingerprint: the releases that ship it}; USES, what the release's
callers use of a policy; SUPPORTED_VLLM, what the [vllm] extra installs."""

SUPPORTED_VLLM = ">=0.30.0,<0.35"
FILES: dict[str, dict[str, str]] = {
    "0.30.0": {
        "arc.py": "e4350b3ee0a706c31a30338065506460d83b421416c86155ecbc49f18c06172a",
        "base.py": "bba63a6ee5e34eba36c231c589956bbd241e3fc540ae746e803e2742022dc410",
        "cpu/manager.py": "b8cbe365f0d3e8603fe7b64ad61ff1fce395216a22c3fae72f9c019981a1349a",
        "tiering/manager.py": "39c6d967019acbf29fc84e5c95a6ba564549f5e59570b4854c13af5bd05c041c",
    },
    "0.31.0": {
        "arc.py": "c38c4f072bc23bc78471b98de4bf9b5c70206f2faca52e32e21bd4e23dbb3d5f",
        "base.py": "db2d40b47abf08bfcedeb4a283cf7d8569dba83e94cf4425ff29784b36c40541",
        "cpu/manager.py": "d7a76c83e04b0de4b572591823bb8290e57c17d73c5b8b68d1221fde86b6daf2",
        "tiering/manager.py": "abaccebe49eefb639ca7a9526bd1fc4627cf418e5579f74f8662db0ba673bffd",
    },
    "0.32.0": {
        "arc.py": "c38c4f072bc23bc78471b98de4bf9b5c70206f2faca52e32e21bd4e23dbb3d5f",
        "base.py": "db2d40b47abf08bfcedeb4a283cf7d8569dba83e94cf4425ff29784b36c40541",
        "cpu/manager.py": "e403633a3092d508be5c66c1096f3a0349f6e3c425fe6e6800a6fd0603ee6a95",
        "tiering/manager.py": "8c38e771d321d98ab18fd7582c152d02abc00eb53eab91ececf935dc5f2fe20f",
    },
    "0.33.0": {
        "arc.py": "82896f3ffd58fe585e97bbb9d372b8b419ce7d8372c6c2d615a30653e686425c",
        "base.py": "639e8497001bf054997eda96a0f9b010d87f154ac43de093a82ebc65fafb3c42",
        "cpu/manager.py": "88784ae36105a55f71c34dbb38e927f0c201749061a980e99f90167622132783",
        "tiering/manager.py": "65dd6d22c894d0f2c0f4d1c35e3a3fccff5c55df01d2de174a55c0102b7381b6",
    },
    "0.34.0": {
        "arc.py": "78294eaa6ba066c2529784e8390fde55db80582224fad55a8b0b9c1b73703068",
        "base.py": "50b17e84bf308b4f634d0e8bbd8bbfc9a7901b6a07b306ccc9a8ee1e18dc2d19",
        "cpu/manager.py": "009678096e610616119829c840037fda6b78c0b7ce05b7f55f8c583a7a4cf898",
        "tiering/manager.py": "893a3dee133584d13bd396c37809fd7738f4e2814523970583bf841bf8cb2db0",
    },
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
    "0.30.0": (
        "call:__init__ call:clear call:evict call:get call:insert call:mark_evictable "
        "call:mark_non_evictable call:on_request_finished call:remove call:touch "
        "keyword:cache_capacity string:lru"
    ),
    "0.31.0": (
        "call:__init__ call:clear call:evict call:get call:insert call:mark_evictable "
        "call:mark_non_evictable call:on_request_finished call:on_store_miss call:remove "
        "call:touch keyword:cache_capacity string:lru"
    ),
    "0.32.0": (
        "call:__init__ call:clear call:evict call:get call:insert call:mark_evictable "
        "call:mark_non_evictable call:on_request_finished call:on_store_miss call:remove "
        "call:touch keyword:cache_capacity string:lru"
    ),
    "0.33.0": (
        "call:__init__ call:clear call:evict call:get call:insert call:mark_evictable "
        "call:mark_non_evictable call:on_request_access call:on_request_finished "
        "call:on_store_miss call:remove call:touch keyword:cache_capacity string:lru"
    ),
    "0.34.0": (
        "call:__init__ call:clear call:evict call:get call:insert call:mark_evictable "
        "call:mark_non_evictable call:on_request_access call:on_request_finished "
        "call:on_store_miss call:remove keyword:cache_capacity string:lru"
    ),
}
