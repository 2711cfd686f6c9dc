"""f64-math: f64 sin, cos, tan, asin, acos, atan, atan2, tanh, log2 and polar written as f64 arithmetic.

Matches:  `torch.aten.{sin,cos,tan,asin,acos,atan,tanh,log2}` and `torch.aten.atan2` with an f64
          result, and `torch.aten.polar` with a complex<f64> result; an operand of another dtype
          (atan2(int32, f64)) is converted to f64 first, as torch's promotion does, and atan2 /
          polar operands of different shapes are broadcast to the result's.
Produces: a call to a private function (one per function and shape, inlined by IREE) holding one
          elementwise `linalg.generic` whose body computes the function in f64 `arith` ops only
          (plus math.absf / roundeven / sqrt / exp / log, which IREE's llvm-cpu lowers without libm):
          - sin, cos, tan, polar: k = roundeven(x * 2/pi); r = x - k * pi/2 by Cody-Waite with
            pi/2 split in five 26-bit pieces and a 53-bit tail (183 bits), k split as
            kh + kl (kh a multiple of 2^27) so that every product k * piece is exact; the
            differences are accumulated with TwoSum into r = y0 + y1 (double-double); then
            fdlibm's __kernel_sin / __kernel_cos polynomials on |r| <= pi/4 with the tail y1, and
            the quadrant k mod 4 picks +-sin(r) / +-cos(r) (tan = sin/cos or -cos/sin).
          - atan: fdlibm's s_atan (argument reduction to |t| < 7/16 around atan(0.5), atan(1),
            atan(1.5), atan(inf) with hi + lo constants, an odd polynomial of degree 23); atan2:
            fdlibm's e_atan2 special cases and quadrants around atan(|y / x|); asin(x) =
            atan(|x| / sqrt((1 - x)(1 + x))) and acos(x) = atan(sqrt((1 - x)(1 + x)) / |x|)
            (pi - that for x < 0).
          - tanh: Cephes' rational x + x^3 P(x^2)/Q(x^2) below 0.625, 1 - 2 / (exp(2|x|) + 1) above.
          - log2: log(x) / ln 2, exact (the exponent) when x is a power of two.
Declines: complex operands (complex sin, cos, ...: IREE lowers them through its complex dialect).
Safe because: every step is ordinary IEEE f64 arithmetic with round-to-nearest (no fast-math flags
          are set on these ops; an FMA contraction by LLVM changes nothing in the reduction, whose
          products are all exact). The reduction is exact until the remainder is small and then
          carries its rounding error in y1, for |x| < 2^44 (1.76e13): y0 + y1 is within about
          2^-90 |r| of r = x mod pi/2 even for the doubles closest to a multiple of pi/2 (2^-60.5
          away, x = 45.553093477052), and |r| <= pi/4 (1 + 2^-7). The
          kernels are fdlibm's (< 1 ulp on |r| <= pi/4). Measured, compiled for cpu, against the
          exact values (mpmath) on tests/passes/test_f64_math_numerics.py's inputs (|x| up to
          1.6e13, the doubles nearest multiples of pi/2 included): sin 0.64 ulp, cos 0.69, atan
          0.73, tanh 0.72, atan2 0.94, acos 1.44, log2 1.5, tan 1.65, asin 1.75; against eager
          (glibc) at most 1 ulp for sin, cos, atan, atan2, tanh, acos and 2 for tan, asin, log2. As
          IREE's own code, subnormal inputs read as 0 and subnormal results may be 0. Special values
          follow C99 (sin(+-0) = +-0, atan2's signed zeros and infinities, tanh(+-inf) = +-1,
          nan in, nan out). sin, cos, tan and polar of |x| >= 2^44 give NaN: k no longer fits the
          exact splitting and only a Payne-Hanek reduction (a table of 2/pi's bits) would be
          correct there; NaN says so where a wrong finite value would not.
Why: IREE 3.13's llvm-cpu backend approximates f32 sin/cos/atan/... by polynomials but calls libm
          for f64, which its embedded linker cannot resolve: iree-compile fails with "iree-lld:
          error: undefined symbol: cos" (f64 randn / normal: torch-mlir decomposes them by
          Box-Muller, cos of f64 uniform samples), "sin" (f64 polar), "atan2" (f64 atan2), and
          likewise tan, asin, acos, atan, tanh ("tanh"), log2 ("log2"). It runs on the torch
          dialect after import because torch-mlir's own decompositions (randn) create the cos
          there, after llmc's graph passes; the functions are written in arith rather than torch
          ops so that each step is exactly the IEEE operation written (no promotion, no folding).
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

from llmc.passes._base import IRPass, Requires, builtin_tensor, elementwise_function, register_pass, vtensor_dims, walk_ops

# pi in hexadecimal, 256 bits after the point (checked against mpmath in the numerics test).
PI_HEX = "3.243f6a8885a308d313198a2e03707344a4093822299f31d0082efa98ec4e6c89"


def _pi() -> Fraction:
    whole, frac = PI_HEX.split(".")
    return Fraction(int(whole + frac, 16), 16 ** len(frac))


def _split(value: Fraction, bits: int, pieces: int) -> list[float]:
    """`pieces` doubles of at most `bits` significant bits each, then a 53-bit tail, summing to value."""
    out, rest = [], value
    for _ in range(pieces):
        e = math.floor(math.log2(abs(rest)))
        while Fraction(2) ** e > abs(rest):  # log2 of a Fraction may be off by one near a power of two
            e -= 1
        while Fraction(2) ** (e + 1) <= abs(rest):
            e += 1
        unit = Fraction(2) ** (e - bits + 1)
        piece = round(rest / unit) * unit
        out.append(float(piece))  # exact: at most `bits` bits
        rest -= piece
    out.append(float(rest))
    return out


PIO2_PIECES = _split(_pi() / 2, 26, 5)  # k * piece exact for |k| <= 2^27 (kh / 2^27 and kl below)
LIMIT = 2.0 ** 44  # sin/cos/tan/polar: exact reduction and |r| <= pi/4 (1 + 2^-7) below this |x|
TWO_OVER_PI = float(2 / _pi())
PI = 3.14159265358979311600e+00  # fdlibm's pi, pi/2, pi/4 and pi's low part
PI_LO = 1.2246467991473531772e-16
PIO2 = 1.57079632679489655800e+00
PIO4 = 7.8539816339744827900e-01
LN2 = 6.93147180559945286227e-01
NAN = float("nan")
INF = float("inf")

# fdlibm (musl) __kernel_sin / __kernel_cos, |x| <= pi/4.
S1, S2, S3, S4, S5, S6 = (-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
                          2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10)
C1, C2, C3, C4, C5, C6 = (4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
                          -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11)
# fdlibm s_atan.c
ATANHI = (4.63647609000806093515e-01, 7.85398163397448278999e-01, 9.82793723247329054082e-01, 1.57079632679489655800e+00)
ATANLO = (2.26987774529616870924e-17, 3.06161699786838301793e-17, 1.39033110312309984516e-17, 6.12323399573676603587e-17)
AT = (3.33333333333329318027e-01, -1.99999999998764832476e-01, 1.42857142725034663711e-01, -1.11111104054623557880e-01,
      9.09088713343650656196e-02, -7.69187620504482999495e-02, 6.66107313738753120669e-02, -5.83357013379057348645e-02,
      4.97687799461593236017e-02, -3.65315727442169155270e-02, 1.62858201153657823623e-02)
# Cephes tanh.c, |x| < 0.625
TANH_P = (-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3)
TANH_Q = (1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3)


# ---------------------------------------------------------------------------------------------
# The functions, written once against a small interface `E` (where, abs, round, sqrt, exp, log,
# eq, isnan, signbit, pow2_exponent) and Python operators. The pass evaluates them on `_V` values
# that print arith ops; on numpy float64 arrays (np.where, np.rint, ...) they compute the same
# arithmetic, which tests/passes/test_f64_math_numerics.py checks against mpmath.


def reduce_pio2(E, x):
    """(k, y0, y1): x = k * pi/2 + y0 + y1, |y0 + y1| <= pi/4 (1 + 2^-7), for |x| < LIMIT."""
    k = E.round(x * TWO_OVER_PI)
    kh = E.round(k * 2.0 ** -27) * 2.0 ** 27
    kl = k - kh
    p = PIO2_PIECES
    terms = [kl * p[0]]
    for piece in p[1:-1]:
        terms += [kh * piece, kl * piece]
    terms.append(k * p[-1])
    hi = x - kh * p[0]  # exact (Sterbenz): kh * p[0] is within a factor 2 of x, or 0
    lo = None
    for t in terms:  # TwoSum(hi, -t): s + e == hi - t exactly
        s = hi - t
        bb = s - hi
        e = (hi - (s - bb)) - (t + bb)
        lo = e if lo is None else lo + e
        hi = s
    y0 = hi + lo
    return k, y0, lo - (y0 - hi)


def kernel_sin(E, x, y):
    z = x * x
    w = z * z
    r = S2 + z * (S3 + z * S4) + z * w * (S5 + z * S6)
    v = z * x
    return x - ((z * (0.5 * y - v * r) - y) - v * S1)


def kernel_cos(E, x, y):
    z = x * x
    w = z * z
    r = z * (C1 + z * (C2 + z * C3)) + w * w * (C4 + z * (C5 + z * C6))
    hz = 0.5 * z
    w = 1.0 - hz
    return w + (((1.0 - w) - hz) + (z * r - x * y))


def _quadrant(E, x):
    """(s, c, odd, q): sin and cos of the reduced argument, whether k is odd, and q = k mod 4 in -2..2."""
    k, y0, y1 = reduce_pio2(E, x)
    q = k - 4.0 * E.round(k * 0.25)
    return kernel_sin(E, y0, y1), kernel_cos(E, y0, y1), E.eq(E.abs(q), 1.0), q


def _out_of_range(E, x, value):
    return E.where(E.abs(x) < LIMIT, value, NAN)


def sin_cos(E, x):
    s, c, odd, q = _quadrant(E, x)
    sin = E.where(odd, c, s)
    sin = E.where((q < -0.5) | (q > 1.5), -sin, sin)  # k mod 4 in {2, 3}
    cos = E.where(odd, s, c)
    cos = E.where((q > 0.5) | (q < -1.5), -cos, cos)  # k mod 4 in {1, 2}
    sin = E.where(E.abs(x) < 2.0 ** -27, x, sin)  # sin(x) = x there; keeps -0
    return _out_of_range(E, x, sin), _out_of_range(E, x, cos)


def sin(E, x):
    return sin_cos(E, x)[0]


def cos(E, x):
    return sin_cos(E, x)[1]


def tan(E, x):
    s, c, odd, _ = _quadrant(E, x)
    t = E.where(odd, -c / s, s / c)
    return _out_of_range(E, x, E.where(E.abs(x) < 2.0 ** -27, x, t))


def atan(E, x):
    ax = E.abs(x)
    small, s0, s1, s2 = ax < 0.4375, ax < 0.6875, ax < 1.1875, ax < 2.4375
    t = -1.0 / ax
    t = E.where(s2, (ax - 1.5) / (1.0 + 1.5 * ax), t)
    t = E.where(s1, (ax - 1.0) / (ax + 1.0), t)
    t = E.where(s0, (2.0 * ax - 1.0) / (2.0 + ax), t)
    t = E.where(small, ax, t)
    hi = E.where(small, 0.0, E.where(s0, ATANHI[0], E.where(s1, ATANHI[1], E.where(s2, ATANHI[2], ATANHI[3]))))
    lo = E.where(small, 0.0, E.where(s0, ATANLO[0], E.where(s1, ATANLO[1], E.where(s2, ATANLO[2], ATANLO[3]))))
    z = t * t
    w = z * z
    a = AT
    s1_ = z * (a[0] + w * (a[2] + w * (a[4] + w * (a[6] + w * (a[8] + w * a[10])))))
    s2_ = w * (a[1] + w * (a[3] + w * (a[5] + w * (a[7] + w * a[9]))))
    r = hi - ((t * (s1_ + s2_) - lo) - t)  # for |x| < 7/16: |x| - |x| * (s1 + s2), as fdlibm
    r = E.where(x < 0.0, -r, r)
    return E.where(ax < 2.0 ** -27, x, r)


def atan2(E, y, x):
    sx, sy = E.signbit(x), E.signbit(y)
    ax, ay = E.abs(x), E.abs(y)
    q = ay / ax
    big = q > 2.0 ** 60  # fdlibm: |y/x| > 2^60 gives +-pi/2 whatever the sign of x
    z = E.where(big, PIO2, atan(E, q))
    left = sx & ~big
    r = E.where(left, E.where(sy, (z - PI_LO) - PI, PI - (z - PI_LO)), E.where(sy, -z, z))

    def by_signs(a, b, c, d):  # x >= 0: a (y >= 0), b (y < 0); x < 0: c, d
        return E.where(sx, E.where(sy, d, c), E.where(sy, b, a))

    yinf, xinf = E.eq(ay, INF), E.eq(ax, INF)
    r = E.where(yinf, E.where(sy, -PIO2, PIO2), r)
    r = E.where(xinf, E.where(yinf, by_signs(PIO4, -PIO4, 3.0 * PIO4, -3.0 * PIO4), by_signs(0.0, -0.0, PI, -PI)), r)
    r = E.where(E.eq(ax, 0.0), E.where(sy, -PIO2, PIO2), r)
    r = E.where(E.eq(ay, 0.0), E.where(sx, E.where(sy, -PI, PI), y), r)
    return E.where(E.isnan(x) | E.isnan(y), x + y, r)


def _cofactor(E, x):
    return E.sqrt((1.0 - x) * (1.0 + x))  # sqrt(1 - x^2), nan for |x| > 1


def asin(E, x):
    z = atan(E, E.abs(x) / _cofactor(E, x))
    return E.where(E.abs(x) < 2.0 ** -27, x, E.where(x < 0.0, -z, z))


def acos(E, x):
    z = atan(E, _cofactor(E, x) / E.abs(x))
    r = E.where(x < 0.0, PI - (z - PI_LO), z)
    return E.where(E.abs(x) < 2.0 ** -57, PIO2, r)


def tanh(E, x):
    ax = E.abs(x)
    far = 1.0 - 2.0 / (E.exp(2.0 * ax) + 1.0)  # exp overflows to inf past |x| = 354: 1
    s = x * x
    p, q = TANH_P, TANH_Q
    near = x + x * s * ((p[0] * s + p[1]) * s + p[2]) / (((s + q[0]) * s + q[1]) * s + q[2])
    r = E.where(ax < 0.625, near, E.where(x < 0.0, -far, far))
    return E.where(E.eq(x, 0.0), x, r)


def log2(E, x):
    exact, exponent = E.pow2_exponent(x)
    return E.where(exact, exponent, E.log(x) / LN2)


FUNCTIONS = {"sin": sin, "cos": cos, "tan": tan, "asin": asin, "acos": acos, "atan": atan, "tanh": tanh, "log2": log2,
             "atan2": atan2}


# ---------------------------------------------------------------------------------------------
# Printing the functions as the body of a linalg.generic.


def _f64_bits(v: float) -> str:
    return "0x%016X" % struct.unpack(">Q", struct.pack(">d", v))[0]


class _Body:
    def __init__(self):
        self.lines: list[str] = []
        self.n = 0
        self.consts: dict[tuple[str, str], str] = {}

    def emit(self, text: str, ty: str) -> "_V":
        name = f"%v{self.n}"
        self.n += 1
        self.lines.append(f"{name} = {text}")
        return _V(self, name, ty)

    def const(self, value, ty: str = "f64") -> "_V":
        text = _f64_bits(float(value)) if ty == "f64" else str(int(value))  # i1: 0 / 1
        key = (ty, text)
        if key not in self.consts:
            self.consts[key] = self.emit(f"arith.constant {text} : {ty}", ty).name
        return _V(self, self.consts[key], ty)


class _V:
    """An SSA value of the body: f64 (arithmetic), i1 (conditions) or i64 (bits)."""

    def __init__(self, body: _Body, name: str, ty: str):
        self.b, self.name, self.ty = body, name, ty

    def _v(self, other) -> "_V":
        return other if isinstance(other, _V) else self.b.const(other, self.ty)

    def _arith(self, op: str, a, b) -> "_V":
        a, b = self._v(a), self._v(b)
        return self.b.emit(f"arith.{op} {a.name}, {b.name} : f64", "f64")

    def __add__(self, o): return self._arith("addf", self, o)
    def __radd__(self, o): return self._arith("addf", o, self)
    def __sub__(self, o): return self._arith("subf", self, o)
    def __rsub__(self, o): return self._arith("subf", o, self)
    def __mul__(self, o): return self._arith("mulf", self, o)
    def __rmul__(self, o): return self._arith("mulf", o, self)
    def __truediv__(self, o): return self._arith("divf", self, o)
    def __rtruediv__(self, o): return self._arith("divf", o, self)
    def __neg__(self): return self.b.emit(f"arith.negf {self.name} : f64", "f64")

    def _cmp(self, pred: str, o) -> "_V":
        return self.b.emit(f"arith.cmpf {pred}, {self.name}, {self._v(o).name} : f64", "i1")

    def __lt__(self, o): return self._cmp("olt", o)
    def __le__(self, o): return self._cmp("ole", o)
    def __gt__(self, o): return self._cmp("ogt", o)
    def __ge__(self, o): return self._cmp("oge", o)

    def _logic(self, op: str, o) -> "_V":
        return self.b.emit(f"arith.{op} {self.name}, {o.name} : i1", "i1")

    def __and__(self, o): return self._logic("andi", o)
    def __or__(self, o): return self._logic("ori", o)
    def __invert__(self): return self.b.emit(f"arith.xori {self.name}, {self.b.const(True, 'i1').name} : i1", "i1")


class _Ops:
    """`E` for _V values."""

    def __init__(self, body: _Body):
        self.b = body

    def _f(self, v) -> _V:
        return v if isinstance(v, _V) else self.b.const(v)

    def _math(self, op: str, x) -> _V:
        return self.b.emit(f"math.{op} {x.name} : f64", "f64")

    def where(self, c, a, b):
        a, b = self._f(a), self._f(b)
        return self.b.emit(f"arith.select {c.name}, {a.name}, {b.name} : f64", "f64")

    def abs(self, x): return self._math("absf", x)
    def round(self, x): return self._math("roundeven", x)
    def sqrt(self, x): return self._math("sqrt", x)
    def exp(self, x): return self._math("exp", x)
    def log(self, x): return self._math("log", x)

    def eq(self, x, v):
        return x._cmp("oeq", v)

    def isnan(self, x):
        return x._cmp("uno", x)

    def _bits(self, x) -> _V:
        return self.b.emit(f"arith.bitcast {x.name} : f64 to i64", "i64")

    def _int(self, op: str, a: _V, b: int) -> _V:
        return self.b.emit(f"arith.{op} {a.name}, {self.b.const(b, 'i64').name} : i64", "i64")

    def _icmp(self, pred: str, a: _V, b: int) -> _V:
        return self.b.emit(f"arith.cmpi {pred}, {a.name}, {self.b.const(b, 'i64').name} : i64", "i1")

    def signbit(self, x):
        return self._icmp("slt", self._bits(x), 0)

    def pow2_exponent(self, x):
        """(x is a positive normal power of two, its exponent as f64)."""
        bits = self._bits(x)
        field = self._int("shrsi", bits, 52)
        exact = self._icmp("eq", self._int("andi", bits, (1 << 52) - 1), 0) & self._icmp("sgt", field, 0) & self._icmp("slt", field, 0x7FF)
        exponent = self.b.emit(f"arith.sitofp {self._int('subi', field, 1023).name} : i64 to f64", "f64")
        return exact, exponent


# ---------------------------------------------------------------------------------------------
# The pass.

_TORCH_DTYPE = {"f64": 7}
_UNARY = {f"torch.aten.{n}": n for n in ("sin", "cos", "tan", "asin", "acos", "atan", "tanh", "log2")}
_BINARY = {"torch.aten.atan2": "atan2", "torch.aten.polar": "polar"}


def helper_text(name: str, fn: str, dims: list[str], n_inputs: int) -> str:
    """A private function applying `fn` elementwise to n_inputs f64 tensors of shape dims."""
    body = _Body()
    E = _Ops(body)
    args = [_V(body, f"%x{i}", "f64") for i in range(n_inputs)]
    out_elem = "f64"
    if fn == "polar":
        s, c = sin_cos(E, args[1])
        re, im = args[0] * c, args[0] * s
        result = body.emit(f"complex.create {re.name}, {im.name} : complex<f64>", "complex<f64>")
        out_elem = "complex<f64>"
    else:
        result = FUNCTIONS[fn](E, *args)
    return elementwise_function(name, dims, "f64", n_inputs, out_elem, body.lines, result.name)


@register_pass("f64-math", Requires(backends=("llvm-cpu",)))
class F64MathPass(IRPass):
    def run(self, module) -> None:
        from torch_mlir import ir

        names = {**_UNARY, **_BINARY}
        helpers = {str(op.attributes["sym_name"]).strip('"') for op in module.body.operations
                   if "sym_name" in op.attributes}
        for op in walk_ops(module, set(names)):
            fn = names[op.name]
            result = vtensor_dims(str(op.results[0].type))
            want = "complex<f64>" if fn == "polar" else "f64"
            if result is None:
                self.stats.decline(str(op.location), f"{op.results[0].type} result")
                continue
            dims, elem = result
            if elem != want:
                if elem == "complex<f64>":
                    self.stats.decline(str(op.location), "complex<f64> operand")
                continue  # f32, f16, bf16 (and complex<f32>): IREE's llvm-cpu approximates them itself
            operands = list(op.operands[: 2 if fn in ("atan2", "polar") else 1])
            types = [vtensor_dims(str(x.type)) for x in operands]
            if any(t is None or "complex" in t[1] for t in types):
                self.stats.decline(str(op.location), "operand not a real tensor")
                continue
            if len(operands) == 1 and types[0][0] != dims:
                self.stats.decline(str(op.location), "operand and result shapes differ")
                continue
            name = f"__llmc_f64_{fn}_{'x'.join(d if d != '?' else 'D' for d in dims) or 'scalar'}"
            if name not in helpers:
                helper = ir.Module.parse(helper_text(name, fn, dims, len(operands)), module.context)  # alive while moved
                module.body.append(helper.body.operations[0])
                helpers.add(name)
            with ir.InsertionPoint(op), op.location:
                values = [self._as_f64(ir, x, t) for x, t in zip(operands, types)]
                if len(values) == 2:
                    values = [self._broadcast(ir, v, other, dims) for v, other in zip(values, values[::-1])]
                t_in = ir.Type.parse(builtin_tensor(dims, "f64"))
                builtins = [ir.Operation.create("torch_c.to_builtin_tensor", results=[t_in], operands=[v]).result for v in values]
                call = ir.Operation.create("func.call", results=[ir.Type.parse(builtin_tensor(dims, want))], operands=builtins,
                                           attributes={"callee": ir.FlatSymbolRefAttr.get(name)}).result
                back = ir.Operation.create("torch_c.from_builtin_tensor", results=[op.results[0].type], operands=[call]).result
            op.results[0].replace_all_uses_with(back)
            op.erase()
            self.stats.rewrite(fn)

    @staticmethod
    def _as_f64(ir, x, t):
        """x converted to f64 (torch.aten.to.dtype) unless it is f64 already."""
        dims, elem = t
        if elem == "f64":
            return x
        def const(name, ty, attr):
            return ir.Operation.create(name, results=[ir.Type.parse(ty)], attributes=attr).result

        dtype = const("torch.constant.int", "!torch.int", {"value": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), _TORCH_DTYPE["f64"])})
        false = const("torch.constant.bool", "!torch.bool", {"value": ir.BoolAttr.get(False)})
        none = const("torch.constant.none", "!torch.none", {})
        return ir.Operation.create("torch.aten.to.dtype", results=[ir.Type.parse(f"!torch.vtensor<[{','.join(dims)}],f64>")],
                                   operands=[x, dtype, false, false, none]).result

    @staticmethod
    def _broadcast(ir, x, other, dims):
        """x with the result's shape: x * ones_like(other) (exact, and IREE folds the product away)."""
        if vtensor_dims(str(x.type))[0] == dims:
            return x
        none = ir.Operation.create("torch.constant.none", results=[ir.Type.parse("!torch.none")]).result
        ones = ir.Operation.create("torch.aten.ones_like", results=[other.type], operands=[other, none, none, none, none, none]).result
        return ir.Operation.create("torch.aten.mul.Tensor", results=[ir.Type.parse(f"!torch.vtensor<[{','.join(dims)}],f64>")],
                                   operands=[x, ones]).result
