"""Kernel families: the plan (compile-time geometry) of PTX shared by several kinds.

Each module here feeds the macros of templates/families/<same name>.ptx.j2 and defines no kind:
quant_gemv (Q4_K, Q6_K and Q8_0 GEMV), attention (split-KV decode attention), elementwise (f32[n]
skeleton), rope (accurate NeoX rotation). Kind modules import from here, never the other way round.
"""
