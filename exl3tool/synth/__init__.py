"""Tiny synthetic artifacts for tests, examples and benchmarks (deterministic bytes).

    from exl3tool.synth.r7 import build_r7, R7Spec          # R7 checkpoint (GLM-style)
    from exl3tool.synth.r7 import build_rank_sliced          # legacy hybrid_tr3_tail (tp)
    from exl3tool.synth.exl3 import build_exl3, Exl3Spec    # plain tensor_storage EXL3
    from exl3tool.synth.msrt import build_base, build_adapter  # MSRT base and cartridge
    from exl3tool.synth.msrt_edit import rewrite_shard, refresh_shards  # test mutations
    from exl3tool.synth.msrt_dense import build_dense_reference  # dense weights (torch)

Submodules are imported on demand so that `import exl3tool.synth` stays cheap.

A testing boundary: nothing in the package imports synth (import-linter contract
`synth-outside`), and synth writes the format values of its own `literals` module, never the
checker's constants in `exl3tool.formats`.
"""
