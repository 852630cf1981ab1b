"""Floating-point contraction as ptxas may do it (its default --fmad=true): a mul and an add or
sub that uses its product, neither with a rounding modifier, may run as one fused multiply-add,
rounded once (PTX ISA 9.7.3 add/sub/mul for .f32/.f64, 9.7.4 for .f16/.f16x2/.bf16/.bf16x2: "mul/add
and mul/sub sequences with no rounding modifiers may be optimized to use fused-multiply-add
instructions on the target device"; an explicit .rn forbids it).

launch(contract=True) runs every such pair fused (ops' add/sub): the add/sub computes fma of the
mul's factors (as the mul read them), the mul still runs for its other uses. A pair is a mul and a
later add/sub of the same type in one basic block (no label or branch between them) that reads the
mul's destination (or a mov's copy of it), with neither that register nor the mul's guard written
in between, and the same guard on both (or none on the mul); .ftz alike on both, no .sat on the mul
(an add's .ftz and .sat apply to the fused result). Where both of an add's operands are such
products, the first is fused. So every pair fused, against none in the default mode: the two ends
of what ptxas may do, not what it does (it may fuse some pairs of a kernel and not others, or
pairs across blocks after its own rewrites)."""
from .ops import FLOAT_ROUND
from .parser import Pair, Reg, RegDecl, Vec

CONTRACTIBLE = {"f32", "f64", "f16", "f16x2", "bf16", "bf16x2"}


def _type(ins):
    types = [m for m in ins.mods if m in CONTRACTIBLE]
    return types[-1] if types else None


def _plain(ins):
    """Whether a float mul/add/sub may be contracted: a contractible type, no rounding modifier."""
    return _type(ins) is not None and not any(m in FLOAT_ROUND for m in ins.mods)


def _registers(op):
    if isinstance(op, Reg):
        return {op.id}
    if isinstance(op, Pair):
        return {r.id for r in (op.first, op.second) if isinstance(r, Reg)}
    if isinstance(op, Vec):
        return set().union(*(_registers(item) for item in op.items))
    return set()


def contractions(prog) -> dict:
    """{index of an add/sub: (the mul whose product it may take unrounded, which operand, 1 or 2)}."""
    leaders = {ins.target for ins in prog.instructions if ins.target is not None}
    fused, products = {}, {}      # products: register id -> (mul, the registers whose writes end the pair)
    for ins in prog.instructions:
        if ins.index in leaders:
            products = {}
        if ins.base in ("add", "sub") and len(ins.operands) == 3 and _plain(ins):
            for position in (1, 2):
                op = ins.operands[position]
                mul = products.get(op.id, (None,))[0] if isinstance(op, Reg) else None
                if (mul is not None and _type(mul) == _type(ins) and ("ftz" in mul.mods) == ("ftz" in ins.mods)
                        and mul.guard in (None, ins.guard)):
                    fused[ins.index] = (mul, position)
                    break
        written = _registers(ins.operands[0]) if ins.operands else set()
        if written:
            products = {reg: entry for reg, entry in products.items() if not written & entry[1]}
        copied = products.get(ins.operands[1].id) if ins.base == "mov" and isinstance(ins.operands[1], Reg) else None
        if copied is not None and ins.guard is None and isinstance(ins.operands[0], Reg):
            mul = copied[0]      # ptxas sees through copies
            products[ins.operands[0].id] = (mul, {ins.operands[0].id} | ({mul.guard[0]} if mul.guard else set()))
        if (ins.base == "mul" and len(ins.operands) == 3 and _plain(ins) and "sat" not in ins.mods
                and isinstance(ins.operands[0], Reg)):
            ends = {ins.operands[0].id} | ({ins.guard[0]} if ins.guard else set())
            products[ins.operands[0].id] = (ins, ends)
        if ins.base in ("bra", "ret", "exit"):
            products = {}
    return fused


def contract(prog) -> None:
    """Mark prog's contractible pairs for ops to run fused: each such mul also copies its factors
    to two registers of its own (prog.factors: mul index -> the two; its sources may be its
    destination), which the add/sub multiplies unrounded (prog.fused: index -> (the factors, 1 or
    2: which operand is the product))."""
    for index, (mul, position) in sorted(contractions(prog).items()):
        if mul.index not in prog.factors:
            t = _type(mul)
            kind = t if t in ("f32", "f64") else f"b{16 * (2 if t.endswith('x2') else 1)}"
            name = prog.regs[mul.operands[0].id].name
            prog.factors[mul.index] = tuple(Reg(len(prog.regs) + i) for i in range(2))
            prog.regs += [RegDecl(f"{name}$factor{i}", kind) for i in range(2)]
        prog.fused[index] = (prog.factors[mul.index], position)
