"""
The grids reproduce.py runs: named variants (a config file and overrides of train.py), each paired
with the baseline it is compared to, the paper's claim about the pair and the expected sign of
(variant - baseline) validation loss. A grid is a function returning its list of Variants; GRIDS
names them for --grid. Adding a variant to a grid: a Variant(...) line here; its name must say what
its config is (reproduce.name_says refuses a row that runs something else).
"""
import os
import re
from collections import namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository

# ---- sizing of the default grid: the one place to change it -------------------------------------
# config/*_char.py (4 layers x 128, block 64, batch 12) for MAX_ITERS iterations instead of 2000,
# an evaluation every MAX_ITERS / 10. Measured (CPU time of single-thread runs, 2 at a time on 2
# cores): 75 ms/iteration for the baseline, 110-135 for Gemma, DNP, unified and Muon, 100 on
# average over the 17 variants; ~13 s per run for start-up and evaluations. 51 runs x 1000
# iterations: ~48 min.
MAX_ITERS = 1000
MS_PER_ITER, OVERHEAD_S = 100, 13


def sizing(max_iters):
    return [f"--max_iters={max_iters}", f"--lr_decay_iters={max_iters}",
            f"--eval_interval={max(max_iters // 10, 1)}",
            f"--warmup_iters={min(100, max_iters // 10)}", "--keep_checkpoints=1"]


# ---- grids: (name, config file, overrides, baseline it is paired with, the paper's claim,
# expected sign of (variant - baseline) val loss: -1 lower, +1 higher, 0 no claim) ---------------
Variant = namedtuple("Variant", "name config overrides baseline claim sign")
UNIFIED = ("unified (HG+DNP+OR+IWD) lowers the loss (~0.04, dense and MoE, 0.12B-2B; 1.22-1.25x "
           "compute)")
MUON_WSD = "unified still wins under Muon / WSD: a further 0.016-0.019 (0.5B, dense and MoE)"
NOVEC = "DNP's vector, not only its Norm, lowers the loss: freezing g_out at 1 raises it (3.2)"
NOIWD = "IWD helps unified: without decay on its Input-Norm vectors the loss is higher (2.2, 4)"


def default_grid(size="char"):
    """The variants of the CPU grid; size="124m" gives the same variants at the paper's 0.12B."""
    c = lambda name: f"config/{name}_{size}.py"
    v = [Variant("baseline", c("baseline"), [], None, "", 0),
         Variant("noscale", c("noscale"), [], "baseline",
                 "removing scale vectors raises the loss (+0.028 at the same lr, 0.12B; Fig. 1)",
                 +1),
         Variant("gemma_none", c("gemma_none"), [], None, "", 0),
         Variant("gemma_iwd", c("gemma_iwd"), [], "gemma_none",
                 "IWD beats no decay on scale vectors (Gemma-0.5B, QK-norm + post-norm; 2.2)", -1),
         Variant("gemma_all", c("gemma_all"), [], "gemma_iwd",
                 "decaying Output-Norm vectors too is worse than IWD (Gemma-0.5B; 2.2)", +1)]
    for name, claim in [("hetero", "HG: branch-specific vectors lower the loss (3.1)"),
                        ("dp", "DP: the loss descends at least as fast (3.2, Thm 3.1)"),
                        ("dnp", "DNP: dual placement with a norm lowers the loss (3.2)"),
                        ("or", "OR: magnitude-direction reparameterization lowers the loss (3.3)"),
                        ("er", "ER: exponential reparameterization lowers the loss (3.3)"),
                        ("unified", UNIFIED)]:
        v.append(Variant(name, c(name), [], "baseline", claim, -1))
    for tag, flag in [("muon", "--optimizer=muon"), ("wsd", "--lr_schedule=wsd")]:
        v += [Variant(f"baseline_{tag}", c("baseline"), [flag], None, "", 0),
              Variant(f"unified_{tag}", c("unified"), [flag], f"baseline_{tag}", MUON_WSD, -1)]
    # Muon and WSD together, the paper's 0.5B setting, each family at its best Muon rate of the lr
    # grid
    tuned = {"baseline": ["--muon_lr=4e-3"], "unified": ["--muon_lr=1e-3"]}
    tuned = tuned if size == "char" else {}
    muon_wsd = ["--optimizer=muon", "--lr_schedule=wsd"]
    v += [Variant("baseline_muon_wsd", c("baseline"), muon_wsd + tuned.get("baseline", []), None,
                  "", 0),
          Variant("unified_muon_wsd", c("unified"), muon_wsd + tuned.get("unified", []),
                  "baseline_muon_wsd", MUON_WSD, -1)]
    # the controls: DNP's Norm without its vector (what the vector adds), unified without IWD
    v += [Variant("dnp_novec", c("dnp"), ["--sv_placement=dnp_novec"], "dnp", NOVEC, +1),
          Variant("unified_novec", c("unified"), ["--sv_placement=dnp_novec"], "unified", NOVEC,
                  +1),
          Variant("unified_noiwd", c("unified"), ["--sv_weight_decay=none"], "unified", NOIWD,
                  +1)]
    if all(os.path.exists(os.path.join(ROOT, c(f"moe_{k}"))) for k in ("baseline", "unified")):
        v += [Variant("moe_baseline", c("moe_baseline"), [], None, "", 0),
              Variant("moe_unified", c("moe_unified"), [], "moe_baseline", UNIFIED, -1)]
    return v


def core(grid):
    return [v for v in grid if v.name in ("baseline", "noscale", "unified")]


def node_grid(fn):
    """Marks a grid as a node grid: its runs go through torchrun, one at a time on all GPUs, sized
    by --tokens."""
    fn.node = True
    return fn


SCALE = "the gain of unified holds, or grows, with scale (0.12B to 2B; 4)"


@node_grid
def node_350m():
    """Both sizes, so a node can check that unified's gain holds at GPT-2 medium's size too."""
    return [Variant("baseline", "config/baseline_124m.py", [], None, "", 0),
            Variant("unified", "config/unified_124m.py", [], "baseline", UNIFIED, -1),
            Variant("baseline_350m", "config/baseline_350m.py", [], None, "", 0),
            Variant("unified_350m", "config/unified_350m.py", [], "baseline_350m", SCALE, -1)]


LRS = ("5e-4", "1e-3", "2e-3", "4e-3", "8e-3")   # factors of 2 around the recipe's 1e-3


def lr_grid():
    """The paper compares against well-tuned baselines: every family at each learning rate, paired
    with the baseline at the same rate."""
    v = []
    for lr in LRS:
        adamw = [f"--learning_rate={lr}", f"--min_lr={float(lr) / 10:g}"]   # the end: lr / 10
        muon = ["--optimizer=muon", f"--muon_lr={lr}"]   # AdamW's part keeps 1e-3 -> 1e-4
        base, base_muon = f"baseline_lr{lr}", f"baseline_muon_lr{lr}"
        v += [Variant(base, "config/baseline_char.py", adamw, None, "", 0),
              Variant(f"noscale_lr{lr}", "config/noscale_char.py", adamw, base,
                      "removing scale vectors raises the loss (+0.028 same lr, +0.015 retuned, "
                      "0.12B)", +1),
              Variant(f"unified_lr{lr}", "config/unified_char.py", adamw, base, UNIFIED, -1),
              Variant(base_muon, "config/baseline_char.py", muon, None, "", 0),
              Variant(f"unified_muon_lr{lr}", "config/unified_char.py", muon, base_muon, MUON_WSD,
                      -1)]
    return v


# Compute efficiency and scaling: model sizes (layers x width, head size 32) at a fixed number of
# tokens per parameter: the 4x128 recipe's 1000 iterations x 768 tokens over its 0.80M
# non-embedding parameters (0.955 tokens per parameter, 0.77 epochs). Every family trains at 0.5x-2x
# of that budget, each with a complete schedule: the baseline's fitted L(C) gives the budget it
# needs to match a variant's loss, and the gap at each budget says whether the gain is a head start
# that fades with training length or holds. 5x160 at 2x repeats the corpus 3 times.
SIZES = {"2x64": (2, 64, 133), "3x96": (3, 96, 413), "4x128": (4, 128, 1000),
         "5x160": (5, 160, 1976)}
BUDGETS = ("0.5", "1", "1.5", "2")
FAMILIES = {"unified": UNIFIED, "dnp": "DNP: dual placement with a norm lowers the loss (3.2)"}
# the learning-rate check at the smallest and the largest size (the lr grid swept 4x128): the
# recipe's 1e-3, half and twice it, and beyond on the side the best rate lay: 4x at 2x64, whose
# best was 2e-3 or more; a quarter at 5x160, whose best was half. Each family is paired
# with the baseline at its rate
SIZE_LRS = {"2x64": ("5e-4", "2e-3", "4e-3"), "5x160": ("2.5e-4", "5e-4", "2e-3")}


def budget_name(family, size, budget):
    """A scaling-grid variant's name; the families' 1x runs keep their first names
    (unified_4x128)."""
    if budget == "1" and family != "baseline":
        return f"{family}_{size}"
    return f"{family}_{size}_x{budget}"


def scaling_grid():
    v = []
    for size, (n_layer, n_embd, iters) in SIZES.items():
        shape = [f"--n_layer={n_layer}", f"--n_embd={n_embd}", f"--n_head={n_embd // 32}"]
        for b in BUDGETS:
            own = [f"--max_iters={round(iters * float(b))}", *shape]
            base = budget_name("baseline", size, b)
            v.append(Variant(base, "config/baseline_char.py", own, None, "", 0))
            v += [Variant(budget_name(f, size, b), f"config/{f}_char.py", own, base, claim, -1)
                  for f, claim in FAMILIES.items()]
            if size == "4x128" and b == "1":   # both with a head-sized g_out, at the recipe's size
                v += [Variant(f"{f}_head_{size}", f"config/{f}_head_char.py", own, base,
                              f"{f} with a head-sized g_out (sv_dnp_width='head')", -1)
                      for f in ("dnp", "unified")]
        for lr in SIZE_LRS.get(size, ()):
            own = [f"--max_iters={iters}", *shape, f"--learning_rate={lr}",
                   f"--min_lr={float(lr) / 10:g}"]
            v += [Variant(f"baseline_{size}_lr{lr}", "config/baseline_char.py", own, None, "", 0),
                  Variant(f"unified_{size}_lr{lr}", "config/unified_char.py", own,
                          f"baseline_{size}_lr{lr}", UNIFIED, -1)]
    return v


# Regimes, on any prepared corpus (reproduce.py --grid=regime --dataset=NAME): baseline and unified
# at two small sizes for 1 to 100 tokens per non-embedding parameter, the char recipe otherwise.
# A run that would repeat the corpus more than --max_epochs times is skipped (reproduce.py says
# which): on Tiny Shakespeare (1.0M training characters) 2x64 reaches 30 tokens per parameter
# within 3.2 epochs. The scaling grid's 1x budget is TPP_1X tokens per parameter at every size.
TPP_1X = 768_000 / 803_968
REGIME_SIZES = ("2x64", "3x96")
TOKENS_PER_PARAM = ("1", "10", "30", "100")


def regime_grid():
    v = []
    for size in REGIME_SIZES:
        n_layer, n_embd, iters_1x = SIZES[size]
        shape = [f"--n_layer={n_layer}", f"--n_embd={n_embd}", f"--n_head={n_embd // 32}"]
        for tpp in TOKENS_PER_PARAM:
            own = [f"--max_iters={round(iters_1x * float(tpp) / TPP_1X)}", *shape]
            base = f"baseline_{size}_t{tpp}"
            v += [Variant(base, "config/baseline_char.py", own, None, "", 0),
                  Variant(f"unified_{size}_t{tpp}", "config/unified_char.py", own, base, UNIFIED,
                          -1)]
    return v


regime_grid.max_epochs = 1.0   # reproduce.py's default --max_epochs for this grid


# IWD where decay can act: at weight_decay 0.1 a decayed vector shrinks by ~5% in 1000 steps; at
# 1.0 by ~40% (exp(-sum of lr * wd)). The 0.1 rows are the default grid's (gemma_*, unified,
# unified_noiwd).
WDS = ("0.3", "1.0")


def wd_grid():
    v = []
    for wd in WDS:
        f = [f"--weight_decay={wd}"]
        v += [Variant(f"gemma_none_wd{wd}", "config/gemma_none_char.py", f, None, "", 0),
              Variant(f"gemma_iwd_wd{wd}", "config/gemma_iwd_char.py", f, f"gemma_none_wd{wd}",
                      "IWD beats no decay on scale vectors (Gemma-0.5B, QK-norm + post-norm; 2.2)",
                      -1),
              Variant(f"gemma_all_wd{wd}", "config/gemma_all_char.py", f, f"gemma_iwd_wd{wd}",
                      "decaying Output-Norm vectors too is worse than IWD (Gemma-0.5B; 2.2)", +1),
              Variant(f"unified_wd{wd}", "config/unified_char.py", f, None, "", 0),
              Variant(f"unified_noiwd_wd{wd}", "config/unified_char.py",
                      f + ["--sv_weight_decay=none"], f"unified_wd{wd}", NOIWD, +1)]
    return v


# Power where the thesis lives, 12 seeds: DNP's and unified's gain split into the Norm after the
# map (dnp_novec - baseline) and the vector (dnp - dnp_novec), all rows of one code version:
# python -m study.reproduce --grid=power --seeds=12
# (and noscale, for the telemetry without a vector: --variants=noscale --seeds=3)
def power_grid():
    return [v for v in default_grid() if v.name in ("baseline", "noscale", "dnp", "dnp_novec",
                                                      "unified", "unified_novec")]


# IWD where it can mean something: the vectors decayed at 1.0 (sv_decay), the matrices
# at the recipe's 0.1, on the Gemma-style config; iwd_blocks spares g_final, the vector IWD
# changed most at weight decay 1.0 (study/NOTES.md)
def iwd_grid():
    f = ["--sv_decay=1.0"]
    return [Variant("gemma_none_sv1", "config/gemma_none_char.py", f, None, "", 0),
            Variant("gemma_iwd_sv1", "config/gemma_iwd_char.py", f, "gemma_none_sv1",
                    "IWD beats no decay on scale vectors (Gemma-0.5B, QK-norm + post-norm; 2.2)",
                    -1),
            Variant("gemma_iwd_blocks_sv1", "config/gemma_iwd_blocks_char.py", f, "gemma_iwd_sv1",
                    "(our control) IWD without decay on g_final", 0)]


# Length against repetition at 5x160: the 1x budget on the whole training split and on
# its first half (the same validation split), so that the half repeats the corpus as often as
# the whole does at 2x, at the length of 1x
HALF_TRAIN = 501_927   # of Tiny Shakespeare's 1,003,854 training characters


def repeat_grid():
    n_layer, n_embd, iters = SIZES["5x160"]
    own = [f"--max_iters={iters}", f"--n_layer={n_layer}", f"--n_embd={n_embd}",
           f"--n_head={n_embd // 32}"]
    v = []
    for tag, extra in (("", []), ("_half", [f"--train_tokens={HALF_TRAIN}"])):
        base = f"baseline_5x160{tag}"
        v += [Variant(base, "config/baseline_char.py", own + extra, None, "", 0),
              Variant(f"unified_5x160{tag}", "config/unified_char.py", own + extra, base, UNIFIED,
                      -1)]
    return v


# ---- the paper's first two claims, with the power to decide them (12 seeds) ---------------------
# Removing the vectors, at the same lr and each family at its own: every family runs every rate of
# TUNE_LRS on the seeds of TUNE_SEEDS, which pick its best (mean loss) and are then left out of the
# tuned pairs (report.tuned_pairs); the rows at the recipe's 1e-3 keep their plain names and pairs.
# DNP's vector (dnp - dnp_novec) the same way, so that "the vector helps" is not a step-size
# effect of one rate.
TUNE_LRS = ("5e-4", "1e-3", "2e-3", "4e-3")
TUNE_SEEDS = (1, 2)
NOSCALE = "removing scale vectors raises the loss (+0.028 same lr, +0.015 retuned, 0.12B; Fig. 1)"
TUNED_FAMILIES = {"baseline": ("config/baseline_char.py", []),
                  "noscale": ("config/noscale_char.py", []),
                  "dnp": ("config/dnp_char.py", []),
                  "dnp_novec": ("config/dnp_char.py", ["--sv_placement=dnp_novec"])}
TUNED_PAIRS = {"noscale": ("baseline", NOSCALE, +1), "dnp_novec": ("dnp", NOVEC, +1)}


def tuned_grid():
    v = []
    for lr in TUNE_LRS:
        rate = [] if lr == "1e-3" else [f"--learning_rate={lr}", f"--min_lr={float(lr) / 10:g}"]
        for family, (config, own) in TUNED_FAMILIES.items():
            base, claim, sign = TUNED_PAIRS.get(family, (None, "", 0))
            if lr != "1e-3":   # paired by report.tuned_pairs, at each family's best rate
                family, base, claim, sign = f"{family}_lr{lr}", None, "", 0
            v.append(Variant(family, config, own + rate, base, claim, sign))
    return v


# Weight decay and the Norm's kind (paper 2.2): in the plain Pre-Norm model, where an Input-Norm
# vector is not scale-free, IWD and IWD without g_final against no decay, the vectors decayed at
# two strengths (sv_decay), the matrices at the recipe's 0.1 ("all" is "iwd" here: the model has
# no Output-Norm vector); in the Gemma-style model, decay on the Output-Norm vectors only ("owd").
SV_DECAYS = ("0.1", "1.0")
IWD = "IWD beats no decay on scale vectors: decaying Input-Norm vectors helps (2.2)"
OWD = "decaying Output-Norm vectors hurts: they are part of the function (2.2)"


def decay_grid():
    v = [Variant("baseline", "config/baseline_char.py", [], None, "", 0),
         Variant("gemma_none", "config/gemma_none_char.py", [], None, "", 0)]
    for d in SV_DECAYS:
        f = [f"--sv_decay={d}"]
        v += [Variant(f"iwd_sv{d}", "config/iwd_char.py", f, "baseline", IWD, -1),
              Variant(f"iwd_blocks_sv{d}", "config/iwd_blocks_char.py", f, "baseline",
                      "(our control) IWD without decay on g_final", 0),
              Variant(f"gemma_owd_sv{d}", "config/gemma_owd_char.py", f, "gemma_none", OWD,
                      +1)]
    return v


# ---- the fifth round: IWD with an untied head, the gain against size, Muon on one code ---------
# IWD where decay can act (study/NOTES.md, predictions of the fifth round): the head untied, so
# g_final folds into it and adds no expressivity, at 2x64 for 3 epochs at lr 2e-3, where the
# baseline's vectors grow; the matrices decayed at the recipe's 0.1, the vectors at 0.1 and 1.0
UNTIED_ITERS = round(3 * 1_003_854 / 768)   # 3 epochs of Tiny Shakespeare's training split
UNTIED = [f"--max_iters={UNTIED_ITERS}", "--n_layer=2", "--n_embd=64", "--n_head=2",
          "--tie_embeddings=False", "--learning_rate=2e-3", "--min_lr=2e-4"]


def untied_grid():
    base = "baseline_2x64_untied_lr2e-3"
    v = [Variant(base, "config/baseline_char.py", UNTIED, None, "", 0)]
    for d in SV_DECAYS:
        f = UNTIED + [f"--sv_decay={d}"]
        v += [Variant(f"iwd_2x64_untied_lr2e-3_sv{d}", "config/iwd_char.py", f, base, IWD, -1),
              Variant(f"iwd_blocks_2x64_untied_lr2e-3_sv{d}", "config/iwd_blocks_char.py", f,
                      base, "(our control) IWD without decay on g_final", 0)]
    return v


# The gain against model size crossed with training length: a cell is a size at a number of steps,
# each family at its own rate, every rate of the cell run on TUNE_SEEDS, which pick it and are then
# left out of the pairs (report.size_cells). The two cells at the scaling grid's 1x (TPP_1X tokens
# per parameter: 2x64 at 133 steps, 5x160 at 1976) keep their names; the other two say their steps
# (s<steps>), so that at equal steps the two sizes see the same tokens, epochs and warmup. A pick at
# the end of a cell's rates added the next rate out; every cell ran on one code, the later ones
# through --add with the arguments this function gives them.
SIZE_CELLS = {("2x64", 133): ("1e-3", "2e-3", "4e-3", "8e-3"),
              ("5x160", 1976): ("2.5e-4", "5e-4", "1e-3", "2e-3"),
              ("2x64", 1976): ("1e-3", "2e-3", "4e-3", "8e-3", "1.6e-2"),
              ("5x160", 133): ("1e-3", "2e-3", "4e-3", "8e-3")}


def size_name(family, size, steps, lr):
    """A size cell's variant: <family>_<size>[_s<steps>]_lr<lr>."""
    return f"{family}_{size}{'' if steps == SIZES[size][2] else f'_s{steps}'}_lr{lr}"


def size_grid():
    v = []
    for (size, steps), lrs in SIZE_CELLS.items():
        n_layer, n_embd, _ = SIZES[size]
        for lr in lrs:
            own = [f"--max_iters={steps}", f"--n_layer={n_layer}", f"--n_embd={n_embd}",
                   f"--n_head={n_embd // 32}", f"--learning_rate={lr}",
                   f"--min_lr={float(lr) / 10:g}"]
            v += [Variant(size_name(f, size, steps, lr), f"config/{f}_char.py", own, None, "", 0)
                  for f in ("baseline", "unified")]
    return v


# Unified against the baseline under Muon, each at its best muon_lr of the lr grid (its seed 1
# picked them: left out of the pair, report.muon_report), all on one code
def muon_grid():
    muon = ["--optimizer=muon"]
    return [Variant("baseline_muon_lr4e-3", "config/baseline_char.py", muon + ["--muon_lr=4e-3"],
                    None, "", 0),
            Variant("unified_muon_lr1e-3", "config/unified_char.py", muon + ["--muon_lr=1e-3"],
                    None, "", 0)]


GRIDS = {"default": default_grid, "core": lambda: core(default_grid()),
         # the paper's 0.12B table on one node: baseline, noscale, unified; node_full: all
         "node": node_grid(lambda: core(default_grid("124m"))),
         "node_full": node_grid(lambda: default_grid("124m")),
         "node_350m": node_350m, "lr": lr_grid, "scaling": scaling_grid, "wd": wd_grid,
         "regime": regime_grid, "power": power_grid, "iwd": iwd_grid, "repeat": repeat_grid,
         "tuned": tuned_grid, "decay": decay_grid, "untied": untied_grid, "size": size_grid,
         "muon": muon_grid}


def is_node_grid(grids, name):
    return getattr(grids[name], "node", False)


# the words of a row's name after its variant that set keys (reproduce.name_says)
MODIFIERS = {"muon": dict(optimizer="muon"), "wsd": dict(lr_schedule="wsd"),
             "half": dict(train_tokens=HALF_TRAIN), "untied": dict(tie_embeddings=False)}


NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")   # a variant's name is its folder under runs/


SIGNS = {"": 0, "0": 0, "-1": -1, "+1": 1, "1": 1}   # of (variant - baseline) val loss


def parse_added(spec, grid):
    """--add=NAME:CONFIG[:OVERRIDES[:BASELINE[:SIGN[:CLAIM]]]]: a variant from the command line.
    OVERRIDES are train.py's --key=value, separated by commas or spaces; BASELINE defaults to the
    grid's `baseline` ("none": unpaired); SIGN, the expected sign of (variant - baseline) val loss
    (-1 lower, +1 higher, 0 no claim), and CLAIM (the rest, colons included) what it tests. A NAME
    of config/variants.py must run that variant's flags (reproduce.check_named)."""
    name, config, overrides, baseline, sign, claim = (spec.split(":", 5) + [""] * 5)[:6]
    names = {v.name for v in grid}
    if not NAME.fullmatch(name) or name in names:   # one folder under runs/: no "..", no "/"
        raise SystemExit(f"error: --add={spec}: NAME must be new to the grid, made of letters, "
                         f"digits, _ . - and not start with a dot (the grid has {sorted(names)})")
    if not os.path.isfile(os.path.join(ROOT, config)):
        raise SystemExit(f"error: --add={spec}: config file {config!r} not found (give a path "
                         "relative to the repo, e.g. config/unified_char.py)")
    default = "baseline" if "baseline" in names else None
    baseline = None if baseline == "none" else baseline or default
    if baseline and baseline not in names:
        raise SystemExit(f"error: --add={spec}: baseline {baseline!r} is not in the grid; name "
                         f"one of {sorted(names)} or none")
    overrides = [o for o in re.split(r"[,\s]+", overrides) if o]
    if any(not o.startswith("--") or "=" not in o for o in overrides):
        raise SystemExit(f"error: --add={spec}: overrides must be train.py's --key=value, "
                         "separated by commas")
    if sign not in SIGNS or SIGNS[sign] and not baseline:
        raise SystemExit(f"error: --add={spec}: " + (
            f"SIGN must be -1 (lower than the baseline), +1 (higher) or 0 (no claim), not {sign!r}"
            if sign not in SIGNS else "a SIGN needs a BASELINE to compare with, not none"))
    return Variant(name, config, overrides, baseline, claim or "(added on the command line)",
                   SIGNS[sign])
