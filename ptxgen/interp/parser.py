"""PTX text -> Program: one entry's parameters, registers, shared/local layout and a flat
list of Instructions with operands resolved (registers to ids, labels to indices)."""
import re
from dataclasses import dataclass, field

from ..errors import InterpError

TYPES = {  # name -> (bytes, kind); kind u/s/b integer, f float, bf bfloat16 bits, p predicate
    "b8": (1, "b"), "b16": (2, "b"), "b32": (4, "b"), "b64": (8, "b"),
    "u8": (1, "u"), "u16": (2, "u"), "u32": (4, "u"), "u64": (8, "u"),
    "s8": (1, "s"), "s16": (2, "s"), "s32": (4, "s"), "s64": (8, "s"),
    "f16": (2, "f"), "bf16": (2, "bf"), "f32": (4, "f"), "f64": (8, "f"),
    "f16x2": (4, "b"), "bf16x2": (4, "b"), "pred": (1, "p"),
}
# Any PTX type name, TYPES' or not (.u16x2, .f32x2, .b128, .tf32, .e4m3x2, ...): a modifier that
# names a type the interpreter lacks is refused, not taken for another modifier.
TYPE_NAME = re.compile(r"[usbf]\d+(x\d+)?|bf16(x\d+)?|tf32|u?e\dm\d(x\d+)?|s2f6x2")
# Timers: here the launch's count of executed instructions (monotonic and deterministic, as a
# GPU's clocks are monotonic: a kernel may time its phases, the values mean nothing else).
TIMERS = {"%globaltimer": "u64", "%clock64": "u64", "%clock": "u32"}
SPECIAL = {f"%{r}.{c}" for r in ("tid", "ntid", "ctaid", "nctaid") for c in "xyz"} | {
    "%laneid", "%warpid", "%lanemask_eq", "%lanemask_lt", "%lanemask_le", "%lanemask_gt",
    "%lanemask_ge"} | set(TIMERS)

_SPECIAL_PREFIXES = {s.split(".")[0] for s in SPECIAL}
_TOKEN = re.compile(r"""[ \t\r\f\v]*(?:        # a token and the blanks before it
    (?P<hexfloat>0[fF][0-9a-fA-F]{8}(?![\w.])|0[dD][0-9a-fA-F]{16}(?![\w.]))
  | (?P<number>0[xX][0-9a-fA-F]+U?|0[bB][01]+U?|\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+U?)
  | (?P<word>[%.$_A-Za-z][\w$.]*(?:::[\w$.]+)*)
  | (?P<string>"[^"\n]*")
  | (?P<punct>[;,{}\[\]()+\-|!:@<>=*])
)""", re.X)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


# ---- operands --------------------------------------------------------------------------
@dataclass(frozen=True)
class Reg:
    id: int


@dataclass(frozen=True)
class Special:
    name: str


@dataclass(frozen=True)
class Imm:
    value: int | float
    kind: str  # 'int', 'float' (decimal), 'f32bits', 'f64bits'


@dataclass(frozen=True)
class Sym:
    name: str


@dataclass(frozen=True)
class Addr:
    base: Reg | Sym | None
    offset: int


@dataclass(frozen=True)
class Vec:
    items: tuple


@dataclass(frozen=True)
class TensorAddr:
    """[tensorMap, {coordinates}] of cp.async.bulk.tensor."""
    base: Reg | Sym
    coords: Vec


@dataclass(frozen=True)
class Neg:
    reg: Reg


@dataclass(frozen=True)
class Pair:
    first: Reg
    second: Reg


@dataclass(frozen=True)
class Sink:
    pass


# ---- program ---------------------------------------------------------------------------
@dataclass
class RegDecl:
    name: str
    type: str


@dataclass
class Instruction:
    index: int
    line: int
    text: str
    opcode: str
    guard: tuple | None      # (reg id, negated)
    operands: list
    scopes: tuple = ()       # enclosing scope ids, innermost first (label lookup)
    target: int | None = None
    base: str = field(init=False)          # opcode without modifiers
    mods: list = field(init=False)         # the modifiers, in order

    def __post_init__(self):
        self.base, *self.mods = self.opcode.split(".")


# Shared-memory layout as the GPU makes it (measured on an H100, nvJitLink 13.0): the first 1 KB of
# a CTA's shared window is the system's (sm_80+), so static shared data starts at address 0x400;
# the .extern array starts where static data ends, rounded up to 16 bytes only: a larger .align on
# it is not honoured by every toolchain (nvJitLink 13.0 put an `.align 1024` array at 0x450).
SHARED_BASE = 0x400
DYNAMIC_SHARED_ALIGN = 16
# A tensor map's parameter, `.param .align 64 .b8 NAME[128]` (its value: launch's tensor_maps).
TENSOR_MAP = "tensormap"
PARAM_WINDOW = 1 << 36  # tensor-map parameters' addresses, between shared memory's window and the arrays


def tensor_map_address(index):
    """The param-space address of kernel parameter `index`, a tensor map; also its generic
    address (cvta.param is the identity here)."""
    return PARAM_WINDOW + 128 * index


@dataclass
class Variable:
    name: str
    offset: int
    size: int
    align: int = 1


@dataclass
class Program:
    entry: str
    params: list = field(default_factory=list)          # [(name, type)]
    regs: list = field(default_factory=list)            # [RegDecl]
    instructions: list = field(default_factory=list)
    shared: dict = field(default_factory=dict)          # name -> Variable
    shared_size: int = SHARED_BASE                      # end of the static shared data
    dynamic_shared: Variable | None = None              # the .extern .shared array
    local: dict = field(default_factory=dict)
    local_size: int = 0
    reqntid: tuple | None = None
    maxntid: tuple | None = None
    maxnreg: int | None = None
    minnctapersm: int = 1
    lines: list = field(default_factory=list)
    async_registers: set = field(default_factory=set)   # wgmma register operands (hopper.py)
    async_model: type | None = None                      # per-wave state of the async sm_90a ops
    fused: dict = field(default_factory=dict)            # add/sub run as fma (contraction.py)
    factors: dict = field(default_factory=dict)          # their muls' copies of the factors


def _tokenize(text):
    text = _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text)
    tokens = []
    for line, source in enumerate(text.split("\n"), 1):
        end = 0
        for m in _TOKEN.finditer(source):
            if m.start() != end:         # finditer skipped text no token matches
                break
            kind = m.lastgroup
            tokens.append((kind, m.group(kind), line))
            end = m.end()
        if source[end:].strip():
            raise InterpError(f"line {line}: cannot parse PTX near {source[end:].strip()[:20]!r}")
    tokens.append(("eof", "", text.count("\n") + 1))
    return tokens


def _int(text):
    t = text.rstrip("U")
    if t.lower().startswith(("0x", "0b")):
        return int(t, 0)
    if len(t) > 1 and t.startswith("0"):
        return int(t, 8)   # PTX, like C, reads a leading 0 as octal
    return int(t)


def _align(value, alignment):
    return -(-value // alignment) * alignment


class _Parser:
    def __init__(self, text, entry):
        self.toks = _tokenize(text)
        self.pos = 0
        self.lines = text.splitlines()
        self.reg_operands = {}
        self.entry = entry

    # -- cursor
    def peek(self, k=0):
        return self.toks[self.pos + k]

    def next(self):
        tok = self.toks[self.pos]
        self.pos += 1
        return tok

    def expect(self, text):
        tok = self.next()
        if tok[1] != text:
            self.fail(tok[2], f"expected {text!r}, found {tok[1]!r}")
        return tok

    def fail(self, line, msg):
        raise InterpError(f"line {line}: {msg}")

    def skip_statement(self):
        depth = 0
        while True:
            kind, text, line = self.next()
            if kind == "eof":
                return
            depth += text == "{"
            depth -= text == "}"
            if text == ";" and depth <= 0:
                return

    def skip_braces(self):
        while self.peek()[1] != "{":
            self.next()
        depth = 0
        while True:
            kind, text, line = self.next()
            if kind == "eof":
                self.fail(line, "unbalanced braces")
            depth += text == "{"
            depth -= text == "}"
            if depth == 0:
                return

    # -- module
    def parse(self):
        prog = Program(self.entry, lines=self.lines)
        self.prog = prog
        self.module_shared = []
        found = False
        while self.peek()[0] != "eof":
            kind, text, line = self.next()
            if text == ".version":
                self.next()
            elif text == ".target":
                self.next()
                while self.peek()[1] == ",":
                    self.next()
                    self.next()
            elif text == ".address_size":
                if self.next()[1] != "64":
                    self.fail(line, "only .address_size 64 is supported")
            elif text in (".visible", ".weak", ".extern") and self.peek()[1] in (".entry", ".func"):
                continue
            elif text == ".entry":
                name = self.next()[1]
                if name == self.entry:
                    self.parse_entry(prog)
                    found = True
                else:
                    self.skip_braces()
            elif text == ".func":
                self.skip_function()
            elif text in (".shared", ".extern"):
                self.pos -= 1
                self.module_shared.append(self.pos)
                self.skip_statement()
            elif text in (".file", ".loc"):
                self._skip_line(line)
            elif text in (".global", ".const", ".pragma"):
                self.skip_statement()
            else:
                self.fail(line, f"unexpected {text!r} at module scope")
        if not found:
            raise InterpError(f"entry {self.entry!r} not found in the PTX")
        return prog

    def skip_function(self):
        """Skip a .func prototype (ends in `;`) or definition (a braced body)."""
        depth = 0
        while True:
            kind, text, line = self.peek()
            if kind == "eof":
                return
            depth += text == "("
            depth -= text == ")"
            if depth == 0 and text == "{":
                return self.skip_braces()
            self.next()
            if depth == 0 and text == ";":
                return

    def _skip_line(self, line):
        while self.peek()[2] == line and self.peek()[0] != "eof":
            self.next()

    def parse_entry(self, prog):
        self.expect("(")
        while self.peek()[1] != ")":
            words, line = [], self.peek()[2]
            while self.peek()[1] not in (",", ")"):
                words.append(self.next()[1])
            if self.peek()[1] == ",":
                self.next()
            if words[-3:] == ["[", "128", "]"] and words[:-4] == [".param", ".align", "64", ".b8"]:
                prog.params.append((words[-4], TENSOR_MAP))
                continue
            types = [w[1:] for w in words if w.startswith(".") and w[1:] in TYPES]
            if not types or "[" in words:
                self.fail(line, f"unsupported kernel parameter {' '.join(words)}")
            prog.params.append((words[-1], types[0]))
        self.expect(")")
        while self.peek()[1] != "{":
            kind, text, line = self.next()
            if text in (".reqntid", ".maxntid"):
                dims = [_int(self.next()[1])]
                while self.peek()[1] == ",":
                    self.next()
                    dims.append(_int(self.next()[1]))
                setattr(prog, text[1:], tuple(dims + [1] * (3 - len(dims))))
            elif text in (".maxnreg", ".minnctapersm"):
                setattr(prog, text[1:], _int(self.next()[1]))
        saved = self.pos
        for pos in self.module_shared:   # module-scope .shared variables belong to every entry
            self.pos = pos
            self.parse_variable(self.peek()[2])
        self.pos = saved
        self.parse_body(prog)
        if prog.dynamic_shared is not None:
            prog.dynamic_shared.offset = _align(prog.shared_size, DYNAMIC_SHARED_ALIGN)
        for ins in prog.instructions:
            if ins.base == "bra":
                ins.target = self.resolve_label(ins)

    # -- body
    def parse_body(self, prog):
        self.scopes = []           # stack of (scope id, {name: reg id})
        self.labels = {}           # (scope id, name) -> instruction index
        self.scope_count = 0
        while True:
            kind, text, line = self.next()
            if kind == "eof":
                self.fail(line, "unexpected end of PTX inside the entry")
            if text == "{":
                self.scopes.append((self.scope_count, {}))
                self.scope_count += 1
            elif text == "}":
                self.scopes.pop()
                if not self.scopes:
                    return
            elif text == ";":
                continue
            elif kind == "word" and self.peek()[1] == ":":
                self.next()
                key = (self.scopes[-1][0], text)
                if key in self.labels:
                    self.fail(line, f"duplicate label {text}")
                self.labels[key] = len(prog.instructions)
            elif text == ".reg":
                self.parse_reg(line)
            elif text in (".shared", ".local", ".extern"):
                self.pos -= 1
                self.parse_variable(line)
            elif text in (".pragma", ".maxnreg"):
                self.skip_statement()
            elif text in (".loc", ".file"):
                self._skip_line(line)
            elif kind == "word" and text.startswith("."):
                self.fail(line, f"unsupported directive {text}")
            else:
                self.pos -= 1
                self.parse_instruction(prog)

    def parse_reg(self, line):
        type_ = None
        while self.peek()[1].startswith(".") and self.peek()[0] == "word":
            w = self.next()[1][1:]
            if w in TYPES:
                type_ = w
            elif w.startswith("v"):
                self.fail(line, "vector registers are not supported")
        if type_ is None:
            self.fail(line, ".reg without a type")
        while True:
            name = self.next()[1]
            if self.peek()[1] == "<":
                self.next()
                count = _int(self.next()[1])
                self.expect(">")
                for i in range(count):
                    self.declare(f"{name}{i}", type_, line)
            else:
                self.declare(name, type_, line)
            sep = self.next()[1]
            if sep == ";":
                return
            if sep != ",":
                self.fail(line, f"unexpected {sep!r} in .reg")

    def declare(self, name, type_, line):
        scope_id, table = self.scopes[-1]
        if name.split(".")[0] in _SPECIAL_PREFIXES:
            self.fail(line, f"register {name} would shadow the special register of that name")
        if name in table:
            self.fail(line, f"register {name} declared twice")
        unique = name if scope_id == 0 else f"{name}@{scope_id}"
        table[name] = len(self.prog.regs)
        self.prog.regs.append(RegDecl(unique, type_))

    def parse_variable(self, line):
        words = []
        while self.peek()[1] not in (";", "["):
            words.append(self.next()[1])
        dims = []
        while self.peek()[1] == "[":
            self.next()
            dims.append(_int(self.next()[1]) if self.peek()[1] != "]" else None)
            self.expect("]")
        if self.peek()[1] != ";":
            self.fail(line, "variable initialisers are not supported")
        self.next()
        prog = self.prog
        extern = ".extern" in words
        space = ".shared" if ".shared" in words else ".local" if ".local" in words else None
        types = [w[1:] for w in words if w[1:] in TYPES]
        if space is None or not types:
            self.fail(line, f"unsupported variable declaration {' '.join(words)}")
        esize = TYPES[types[0]][0]
        vec = next((int(w[2:]) for w in words if re.fullmatch(r"\.v\d", w)), 1)
        align = next((_int(words[i + 1]) for i, w in enumerate(words) if w == ".align"), esize * vec)
        name = words[-1]
        count = 1
        for d in dims:
            count *= d if d is not None else 0
        if extern:
            if space != ".shared" or None not in dims:
                self.fail(line, "only `.extern .shared` arrays of unknown size are supported")
            prog.dynamic_shared = Variable(name, 0, 0, align)
        elif space == ".shared":
            if name in prog.shared:
                self.fail(line, f"shared variable {name} declared twice")
            offset = _align(prog.shared_size, align)
            prog.shared[name] = Variable(name, offset, esize * vec * count)
            prog.shared_size = offset + esize * vec * count
        else:
            offset = _align(prog.local_size, align)
            prog.local[name] = Variable(name, offset, esize * vec * count)
            prog.local_size = offset + esize * vec * count

    def parse_instruction(self, prog):
        line = self.peek()[2]
        guard = None
        if self.peek()[1] == "@":
            self.next()
            neg = self.peek()[1] == "!"
            if neg:
                self.next()
            guard = (self.register(self.next(), line).id, neg)
        kind, opcode, _ = self.next()
        if kind != "word":
            self.fail(line, f"expected an opcode, found {opcode!r}")
        operands = []
        if self.peek()[1] != ";":
            while True:
                operands.append(self.operand(line))
                sep = self.next()[1]
                if sep == ";":
                    break
                if sep != ",":
                    self.fail(line, f"unexpected {sep!r} in operands of {opcode}")
        else:
            self.next()
        text = self.lines[line - 1].split("//")[0].strip() if line <= len(self.lines) else opcode
        prog.instructions.append(Instruction(
            len(prog.instructions), line, text, opcode, guard, operands,
            tuple(s[0] for s in reversed(self.scopes))))

    def register(self, tok, line):
        name = tok[1]
        for _, table in reversed(self.scopes):
            if name in table:
                rid = table[name]
                if rid not in self.reg_operands:     # one Reg per register: fewer objects
                    self.reg_operands[rid] = Reg(rid)
                return self.reg_operands[rid]
        self.fail(line, f"undeclared register {name}")

    def operand(self, line):
        kind, text, _ = self.peek()
        if text == "{":
            self.next()
            items = []
            while True:
                items.append(self.operand(line))
                sep = self.next()[1]
                if sep == "}":
                    return Vec(tuple(items))
                if sep != ",":
                    self.fail(line, f"unexpected {sep!r} in a vector operand")
        if text == "[":
            self.next()
            base, offset = None, 0
            if self.peek()[0] == "word":
                base = self.name_operand(self.next(), line)
            sign = 1
            while self.peek()[1] != "]":
                tok = self.next()
                if tok[1] == "," and isinstance(base, (Reg, Sym)) and offset == 0:
                    coords = self.operand(line)
                    if not isinstance(coords, Vec) or self.next()[1] != "]":
                        self.fail(line, "expected [tensorMap, {coordinates}]")
                    return TensorAddr(base, coords)
                if tok[1] in "+-":
                    sign = -sign if tok[1] == "-" else sign
                elif tok[0] == "number":
                    offset += sign * _int(tok[1])
                    sign = 1
                else:
                    self.fail(line, f"unsupported address component {tok[1]!r}")
            self.next()
            if isinstance(base, (Special, Pair)):
                self.fail(line, "unsupported address base")
            return Addr(base, offset)
        if text == "!":
            self.next()
            return Neg(self.register(self.next(), line))
        if text == "-":
            self.next()
            imm = self.operand(line)
            if not isinstance(imm, Imm) or imm.kind not in ("int", "float"):
                self.fail(line, "unsupported negated operand")
            return Imm(-imm.value, imm.kind)
        self.next()
        if kind == "hexfloat":
            return Imm(int(text[2:], 16), "f32bits" if text[1] in "fF" else "f64bits")
        if kind == "number":
            if re.fullmatch(r"\d+U?|0[xXbB][0-9a-fA-F]+U?", text):
                return Imm(_int(text), "int")
            return Imm(float(text), "float")
        if kind == "word":
            op = self.name_operand((kind, text, line), line)
            if isinstance(op, (Reg, Sink)) and self.peek()[1] == "|":
                self.next()
                return Pair(op, self.register(self.next(), line))
            return op
        self.fail(line, f"unexpected {text!r} in operands")

    def name_operand(self, tok, line):
        name = tok[1]
        if name == "_":
            return Sink()
        if name in SPECIAL:
            return Special(name)
        if name.startswith("%"):
            return self.register(tok, line)
        return Sym(name)

    def resolve_label(self, ins):
        target = ins.operands[0] if ins.operands else None
        if not isinstance(target, Sym):
            raise InterpError(f"line {ins.line}: `{ins.text}`: branch target must be a label")
        for scope in ins.scopes:
            if (scope, target.name) in self.labels:
                return self.labels[(scope, target.name)]
        raise InterpError(f"line {ins.line}: `{ins.text}`: unknown label {target.name}")


def parse(text: str, entry: str) -> Program:
    """Parse the named .entry of a PTX module."""
    return _Parser(text, entry).parse()
