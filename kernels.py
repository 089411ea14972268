"""
Fast versions of five operations of model.py, as autograd functions with the backward written
out. model.py holds the plain PyTorch definition of each (the math, and the oracle of
tests/test_kernels.py) and uses these by default; GPTConfig(kernels=False) trains on the plain
definitions alone.

Each function computes the same values as its plain definition; the backward is written by hand
to keep fewer activations for it, or to run fewer full-size passes than autograd's chain of small
operations:

  norm(x)            y = Norm(x) = x * r,  r = 1 / sqrt(mean(x^2) + eps) over the last dimension
                     dx = r * (dy - y * mean(dy * y))
                     Autograd's F.rms_norm backward is a chain of small ops, about twice as slow
                     on a CPU. The statistic reads x once through vector_norm, accumulated and
                     kept in float32 as in the plain definition (dtype=float32: a bf16 result
                     would round r to 8 bits, one error for a whole row); a bf16
                     x.pow(2).mean() is many times slower on a CPU.

  scaled_norm(y, g)  out = g * Norm(y)  (DNP's g_out, paper 3.2), g broadcast over y's leading dims
                     with n = out / g and dn = dout * g:
                     dg = sum(dout * n),  dy = r * (dn - n * mean(dn * n))
                     with mean(dn * n) = mean(dout * out). Backward: 4 full-size passes, 2
                     reductions, 2 full-size buffers (n reuses the buffer of dout * out).
                     It keeps only its output, which the next operation keeps anyway (attention
                     keeps v, a view of the same qkv tensor; SwiGLU keeps gate|up), and recovers
                     Norm(y) = out / g in the backward, as In-Place ABN does (Rota Bulo et al.,
                     2018): DNP then adds one float per token and group to the saved activations
                     (tests/test_kernels.py counts them exactly). 124M on CPU, bf16, batch
                     2x1024, interleaved in one process: the unified strategy's step time went
                     from 1.47-1.67x to 1.01-1.06x the baseline's (commit 52b2263).

  output_norm_(y, g) scaled_norm (or norm, g None) of each group of y's last dimension: DNP's
                     output side, in y's shape; see below for kernels.c's in-place version.

  swiglu(gate|up)    h = silu(gate) * up;  dgate = dh * up * silu'(gate),  dup = dh * silu(gate)
                     It keeps only gate|up; autograd would keep gate, silu(gate) and up.

  cross_entropy      mean over rows with target >= 0 of lse(logits) - logits[target];
                     dlogits = (softmax(logits) - one_hot(target)) / n_valid
                     In float32, one chunk of rows at a time; it keeps only the logits and one
                     log-sum-exp per row, where F.cross_entropy(logits.float()) keeps two float32
                     copies of them (0.4 GB each for 2048 tokens of a 50k vocabulary). 124M on
                     CPU, bf16, batch 2x1024: peak RSS 4,446 -> 3,829 MB, step time about 0.8x
                     (commit 4abb067).

All of them compile with torch.compile(fullgraph=True) (tests/test_kernels.py).

On a CPU in float32 (the CPU recipe), in eager mode, norm and scaled_norm run kernels.c: the same
math in one pass each way (the statistic, the scaling and dg from one read of a row) in place of
2-4 passes and a dozen small operations, which at 128 wide cost more than the matmuls around them
(issue 23), on PyTorch's threads. output_norm_ (DNP's output side) writes its result over the
map's output, which nothing else keeps: no second buffer, each row written back from cache. norm
is g * Norm(x) there with g = 1, the arithmetic of scaled_norm, so DNP's control is DNP at
g_out = 1 bit for bit. c_library() builds it on first use with the machine's C compiler and loads
it through ctypes; where it cannot be built, the PyTorch ops above, with a warning.

And one setting of the C allocator, retain_freed_memory(): on a CPU the step time of these small
models was set less by arithmetic than by page faults (issue 23).
"""
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import warnings

import torch
import torch.nn.functional as F


def _rms_inverse(x, eps):
    """r = 1 / sqrt(mean(x^2) + eps) over the last dimension, shape (..., 1), in float32 (float64
    for float64). The sum of squares is accumulated and returned in float32 (dtype=): a bf16 result
    would round the statistic to 8 bits, one error shared by a whole row."""
    acc = torch.promote_types(x.dtype, torch.float32)
    ss = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=acc).square()   # (..., 1)
    return torch.rsqrt(ss / x.size(-1) + eps)


def _mean(x):
    """mean over the last dimension, kept: sum / d (a bf16 mean() on a CPU is several times
    slower than sum())."""
    return x.sum(-1, keepdim=True) / x.size(-1)


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps):
        r = _rms_inverse(x, eps)
        y = (x * r).to(x.dtype)
        ctx.save_for_backward(y, r)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, r = ctx.saved_tensors
        return torch.addcmul(dy, y, _mean(dy * y), value=-1).mul_(r).to(dy.dtype), None


class _ScaledNorm(torch.autograd.Function):
    """(An entry of g that is exactly 0 would lose its gradient; a trained g never lands on
    exactly 0.)
    The small factors r and g are cast to y's dtype so that every full-size operation runs in it
    (bf16 under autocast: half the traffic)."""

    @staticmethod
    def forward(ctx, y, g, eps):
        ctx.g_dtype = g.dtype
        r, g = _rms_inverse(y, eps).to(y.dtype), g.to(y.dtype)
        out = (y * r).mul_(g)
        ctx.save_for_backward(out, g, r)
        return out

    @staticmethod
    def backward(ctx, dout):
        # with n = out / g:  dg = sum(dout * n),  dy = r * (g * dout - n * mean(dout * out));
        # 4 full-size passes and 2 reductions, 2 full-size buffers (n reuses dout * out's)
        out, g, r = ctx.saved_tensors
        inv_g = 1 / torch.where(g == 0, 1, g)
        d = dout * out
        dg = (d.sum_to_size(g.shape) * inv_g).to(ctx.g_dtype)
        m = _mean(d)                              # mean(dn * n) = mean(dout * out)
        n = torch.mul(out, inv_g, out=d)
        return torch.mul(dout, g).addcmul_(n, m, value=-1).mul_(r), dg, None


class _ScaledNormC(torch.autograd.Function):
    """_ScaledNorm's math in kernels.c: one pass forward, one backward (CPU, float32, eager).
    y is taken as `shape` (..., D): every row of D is a group; g is expanded to the g_out rows of
    one token, P rows of D. inplace=True writes the result over y (contiguous) and returns it: no
    second buffer, and each row is written back while it is in cache (mark_dirty: autograd then
    refuses a backward that would need y's old values)."""

    @staticmethod
    def forward(ctx, y, g, eps, shape, inplace):
        yv = (y if inplace else y.contiguous()).view(shape)
        ge = g.expand(yv.shape[yv.dim() - g.dim():]).contiguous()   # (..., D): P rows of g_out
        D = yv.size(-1)
        out, r = yv if inplace else torch.empty_like(yv), yv.new_empty(yv.numel() // D)
        c_library().scaled_norm_forward(yv.data_ptr(), ge.data_ptr(), out.data_ptr(),
                                        r.data_ptr(), len(r), D, ge.numel() // D, eps)
        ctx.g_shape, ctx.shape = g.shape, shape
        if inplace:
            ctx.mark_dirty(y)
            out = y
        ctx.save_for_backward(out, ge, r)
        return out

    @staticmethod
    def backward(ctx, dout):
        saved, ge, r = ctx.saved_tensors
        out = saved.view(ctx.shape)
        dout, D = dout.contiguous().view(out.shape), out.size(-1)
        dy, dg, inv_g = torch.empty_like(out), torch.empty_like(ge), torch.empty_like(ge)
        c_library().scaled_norm_backward(dout.data_ptr(), out.data_ptr(), ge.data_ptr(),
                                         inv_g.data_ptr(), r.data_ptr(), dy.data_ptr(),
                                         dg.data_ptr(), len(r), D, ge.numel() // D)
        return dy.view(saved.shape), dg.sum_to_size(ctx.g_shape), None, None, None


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        ctx.save_for_backward(gate_up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, dh):
        # torch.cat, not out= into a strided half: out= made torch.compile fall back to eager
        gate, up = ctx.saved_tensors[0].chunk(2, dim=-1)
        return torch.cat((torch.ops.aten.silu_backward(dh * up, gate), dh * F.silu(gate)), dim=-1)


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, rows):
        valid, t = targets >= 0, targets.clamp(min=0).unsqueeze(1)
        ctx.rows, ctx.acc = rows, torch.promote_types(logits.dtype, torch.float32)
        lse = torch.cat([torch.logsumexp(chunk.to(ctx.acc), dim=-1)
                         for chunk in logits.split(rows)])
        ctx.save_for_backward(logits, t, lse, valid)
        return ((lse - logits.gather(1, t).squeeze(1).to(ctx.acc)) * valid).sum() / valid.sum()

    @staticmethod
    def backward(ctx, grad_loss):
        logits, t, lse, valid = ctx.saved_tensors
        # d loss / d logits = (softmax - one_hot(target)) * scale, row by row
        scale = valid * grad_loss / valid.sum()
        grad = torch.empty_like(logits)
        for s in range(0, len(logits), ctx.rows):
            rows = slice(s, s + ctx.rows)
            p = (logits[rows].to(ctx.acc) - lse[rows, None]).exp_()
            minus_one = torch.full(t[rows].shape, -1.0, dtype=p.dtype, device=p.device)
            p.scatter_add_(1, t[rows], minus_one)
            grad[rows] = p.mul_(scale[rows, None])
        return grad, None, None


def in_c(*tensors):
    """kernels.c applies: CPU tensors in float32, not empty, eager (torch.compile traces the
    PyTorch ops), and the library built."""
    return (not torch.compiler.is_compiling()
            and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.numel()
                    for t in tensors)
            and c_library() is not None)


def norm(x, eps):
    """Norm(x), no parameter. In kernels.c as g * Norm(x) with g = 1: the same arithmetic as
    scaled_norm's, so DNP's control (its Norm without g_out) is DNP at g_out = 1 bit for bit."""
    if in_c(x):
        return _ScaledNormC.apply(x, x.new_ones(x.size(-1)), eps, x.shape, False)
    return _Norm.apply(x, eps)


def scaled_norm(y, g, eps):
    """g * Norm(y), in y's dtype."""
    if in_c(y, g):
        return _ScaledNormC.apply(y, g, eps, y.shape, False)
    return _ScaledNorm.apply(y, g, eps)


def output_norm_(y, g, groups, eps):
    """g * Norm(.) of each group of y's last dimension (y (..., d) split as `groups`), in y's
    shape; g None: the Norm alone. In kernels.c it overwrites y, which must then be a tensor
    nothing else keeps (the fresh output of a linear map); elsewhere y is left as it is."""
    if in_c(y) and y.is_contiguous() and (g is None or in_c(g)):
        g = y.new_ones(groups[-1]) if g is None else g
        return _ScaledNormC.apply(y, g, eps, (*y.shape[:-1], *groups), True)
    yg = y.unflatten(-1, groups)
    return (norm(yg, eps) if g is None else scaled_norm(yg, g, eps)).flatten(-len(groups))


def swiglu(gate_up):
    """silu(gate) * up from gate|up concatenated on the last dimension."""
    return _SwiGLU.apply(gate_up)


def cross_entropy(logits, targets, rows=None):
    """Mean cross-entropy of logits (N, V) over the targets (N,) that are not -1. Chunks of 2M
    logits on a CPU: malloc reuses blocks that small, while a fresh large one is page-faulted in
    on every step (3x slower at 124M; see also retain_freed_memory); elsewhere chunks of 64M, for
    few kernel launches."""
    rows = rows or max(1, (2**21 if logits.device.type == "cpu" else 2**26) // logits.size(-1))
    return _CrossEntropy.apply(logits, targets, rows)


def retain_freed_memory():
    """Make glibc's malloc keep the memory a training step frees, for the next step to reuse.

    A CPU step allocates and frees the same activation buffers every step, most of them 0.1-32 MB.
    By default glibc serves blocks above a threshold (128 kB, raised as such blocks are freed)
    with mmap and returns them with munmap, and gives the top of its heap back to the OS whenever
    more than twice that is free: each step then touches fresh pages, one page fault (and a page
    of zeros) per 4 kB. At the CPU recipe (4 x 128, batch 12 x 64) that was 1,256 faults per step
    for the baseline and 4,611 for the unified strategy, whose Norms after the maps add large
    temporaries: most of unified's extra step time. Blocks up to 32 MB (glibc's largest mmap
    threshold) now come from the heap, which is never trimmed: 80 and 1 faults per step, the peak
    memory unchanged (BENCHMARKS.md). Values are untouched. Returns False where there is no glibc
    (macOS, musl), which then keeps its own policy."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc's malloc.h
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20) and mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


C_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.c")


def c_flags(threads=True):
    """The C compiler's flags: vector instructions as far as PyTorch's own CPU kernels use them
    on this machine (not -march=native: a cached library may be loaded on another machine), and
    with threads=True OpenMP, whose runtime PyTorch has already loaded (libgomp.so.1), so that the
    loops over rows run on PyTorch's threads; -fopenmp-simd: one thread."""
    arch = {"AVX2": ["-mavx2", "-mfma"],
            "AVX512": ["-mavx512f", "-mavx512vl", "-mavx2", "-mfma"]}
    omp = "-fopenmp" if threads and torch.backends.openmp.is_available() else "-fopenmp-simd"
    return ["-O3", omp, "-fno-math-errno", "-shared", "-fPIC",
            *arch.get(torch.backends.cpu.get_cpu_capability(), [])]


def c_build(cc, flags):
    """The path of kernels.c compiled with these flags, built once per source and flags into
    ~/.cache/scale_vectors ($XDG_CACHE_HOME); OSError if the compiler is missing or fails."""
    with open(C_SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(source + " ".join([cc, *flags, platform.machine()]).encode())
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                         "scale_vectors")
    path = os.path.join(cache, f"kernels-{key.hexdigest()[:16]}.so")
    if not os.path.exists(path):
        if shutil.which(cc) is None:
            raise OSError(f"no C compiler {cc!r} (set CC)")
        os.makedirs(cache, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        build = subprocess.run([cc, *flags, C_SOURCE, "-o", tmp, "-lm"],
                               capture_output=True, text=True)
        if build.returncode:
            raise OSError(f"{cc} failed: {build.stderr.strip()[-300:]}")
        os.replace(tmp, path)   # atomic: DDP ranks that build at once each load a whole file
    return path


@functools.cache
def c_library():
    """kernels.c compiled (c_build) and loaded through ctypes, with OpenMP where the compiler has
    it (Apple's clang has not: one thread); None, with a warning, where it cannot be built at all:
    norm and scaled_norm then run in PyTorch ops, the same values, slower."""
    cc = os.environ.get("CC", "cc")
    try:
        try:
            lib = ctypes.CDLL(c_build(cc, c_flags()))
        except OSError:
            lib = ctypes.CDLL(c_build(cc, c_flags(threads=False)))
    except OSError as e:
        warnings.warn(f"kernels.c not built ({e}): Norm and g * Norm run in PyTorch ops, slower")
        return None
    ptr, n = ctypes.c_void_p, ctypes.c_long
    lib.scaled_norm_forward.argtypes = [ptr] * 4 + [n] * 3 + [ctypes.c_float]
    lib.scaled_norm_backward.argtypes = [ptr] * 7 + [n] * 3
    return lib
