"""FX graph passes, one per file, each ``(gm: GraphModule, config) -> GraphModule``.

The passes that rewrite Qwen3 attention into KVpop bounded attention build on the reference
ops of :mod:`kvpop_compile.runtime`; none is registered yet.
"""
