"""Reference runtime (torch): EXL3 linear, MoE block, MSRT stages, swap engine, distributed TP."""
