"""
The paper's named variants: the keys each sets, GPTConfig's flags (model keys) and train.py's other
keys (training keys, config/defaults.py: sv_weight_decay, sv_decay, ...), and the helpers that read
them. config/<name>_char.py and config/<name>_124m.py set a variant's keys (one whose flag acts in
an MoE only: config/moe_<name>_char.py), a grid row of study/grids.py is named after one;
tests/test_variant_tables.py checks every config file and grid row against this table. model.py
never reads it.
"""
UNIFIED = dict(sv_hetero=True, sv_placement="dnp", sv_reparam="or",   # paper 4
               sv_weight_decay="iwd")
GEMMA = dict(qk_norm=True, post_norm=True)   # Gemma-style Output-Norms: QK-norm and post-norms
VARIANTS = {
    "baseline": {},
    "noscale": dict(scale_vectors=False),
    "hetero": dict(sv_hetero=True),
    "dp": dict(sv_placement="dp"),
    "dnp": dict(sv_placement="dnp"),
    "dnp_head": dict(sv_placement="dnp", sv_dnp_width="head"),
    "dnp_novec": dict(sv_placement="dnp_novec"),
    "or": dict(sv_reparam="or"),
    "er": dict(sv_reparam="er"),
    "iwd": dict(sv_weight_decay="iwd"),
    "iwd_blocks": dict(sv_weight_decay="iwd_blocks"),
    "gemma_none": dict(GEMMA, sv_weight_decay="none"),
    "gemma_iwd": dict(GEMMA, sv_weight_decay="iwd"),
    "gemma_all": dict(GEMMA, sv_weight_decay="all"),
    "gemma_iwd_blocks": dict(GEMMA, sv_weight_decay="iwd_blocks"),
    "gemma_owd": dict(GEMMA, sv_weight_decay="owd"),
    "unified": UNIFIED,
    "unified_head": dict(UNIFIED, sv_dnp_width="head"),
    "unified_novec": dict(UNIFIED, sv_placement="dnp_novec"),
    "unified_noiwd": dict(UNIFIED, sv_weight_decay="none"),
}


def variant_of(name):
    """The named variant a config file or grid row is named after: its longest '_'-prefix in
    VARIANTS, after a leading 'moe_' (an MoE twin, or an MoE-only variant); None if none."""
    parts = name.removeprefix("moe_").split("_")
    return next(("_".join(parts[:i]) for i in range(len(parts), 0, -1)
                 if "_".join(parts[:i]) in VARIANTS), None)


def flag_keys():
    from model import VECTOR_FLAGS   # here: a summary need not import torch
    return ("scale_vectors", *VECTOR_FLAGS, "sv_weight_decay")


def model_keys(flags):
    """The model keys of a variant's flags (GPTConfig's fields); the others are training keys."""
    from dataclasses import fields
    from model import GPTConfig
    return {k: v for k, v in flags.items() if k in {f.name for f in fields(GPTConfig)}}


def named_flags(name):
    """What a config file or grid row of VARIANTS[name] must set: its entry over every variant
    flag's default (scale_vectors, model.VECTOR_FLAGS: GPTConfig's; sv_weight_decay: train.py's
    "none", the tests read baseline_char.py's), and each training key the entry sets."""
    from dataclasses import fields
    from model import GPTConfig
    default = {f.name: f.default for f in fields(GPTConfig)} | {"sv_weight_decay": "none"}
    return {k: VARIANTS[name].get(k, default[k]) for k in flag_keys()} | VARIANTS[name]
