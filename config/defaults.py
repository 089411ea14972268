"""
train.py's config keys and their defaults: the one place they are written. A config file
(config/*.py) sets some of them, then --key=value overrides (configurator.py); the values each
key allows are configurator.TRAIN_RULES. bench.py and reproduce.py read the same keys here, as
values, so `max_iters = 5 * 1000` below changes nothing for them.

Every module-level name below is a key; the model's keys are the fields of model.GPTConfig.
"""
from dataclasses import fields

from model import GPTConfig

# I/O
out_dir = "out"
eval_interval = 250
eval_iters = 20            # fixed validation batches: the same ones at every eval and in every run
log_interval = 10
init_from = "scratch"      # "scratch" | "resume" (the newest complete checkpoint in out_dir)
overwrite = False          # scratch into an out_dir that holds a run: True deletes its checkpoints
                           # and metrics
resume_fallback = False    # on resume, skip a corrupt newest checkpoint for the one before it
keep_checkpoints = 3
final_eval = True          # at the end: the loss on the whole val split and on as many train tokens
wandb_log = False          # also log to Weights & Biases (pip install wandb), rank 0 only
wandb_project = "scale-vectors"
wandb_run_name = ""        # "": out_dir's name; a resumed run continues the same wandb run
# data
dataset = "shakespeare_char"   # data/<dataset>/{train,val}.bin from prepare_data.py
batch_size = 12            # sequences per micro-step and process
gradient_accumulation_steps = 1   # micro-steps per optimizer step, summed over all processes
train_tokens = 0           # train on the first N tokens of train.bin only (0: all of them): less
                           # text, the same validation split
# model: every field of model.GPTConfig is a key too (block_size, n_layer, sv_hetero, ...); the
# vocabulary's size comes from the dataset's meta.json, not from a key
globals().update({f.name: f.default for f in fields(GPTConfig) if f.name != "vocab_size"})
# optimizer
optimizer = "adamw"        # "adamw" | "muon": Muon for the 2-D hidden matrices, AdamW for the rest
learning_rate = 6e-4       # AdamW's
muon_lr = 0.0              # 0: learning_rate (Muon's update is scaled to AdamW's RMS,
                           # "match_rms_adamw")
muon_momentum = 0.95
max_iters = 5000
weight_decay = 0.1         # on matrices and embeddings
sv_weight_decay = "none"   # which scale vectors get decayed, and toward what: a key of
                           # model.DECAY_POLICIES ("none" | "all" | "iwd": Input-Norm vectors only)
sv_decay = -1.0            # their weight decay; -1: weight_decay's value
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0            # 0 disables
# learning rate: linear warmup, then a schedule that ends at min_lr (as a fraction of each group's
# lr)
lr_schedule = "cosine"     # "cosine" | "wsd" (warmup-stable-decay) | "constant"
warmup_iters = 100
lr_decay_iters = 0         # 0: max_iters; the schedule's end
min_lr = 6e-5
wsd_decay_frac = 0.2       # wsd: the last 20% of lr_decay_iters decay
wsd_shape = "linear"       # wsd: "linear" | "1-sqrt" (Hagele et al. 2024)
# system
device = ""                # "" picks cuda, then mps, then cpu
dtype = ""                 # "float32" | "bfloat16" (autocast) | "float64" (a reference run); ""
                           # picks bfloat16 on CUDA, float32 elsewhere
compile = False            # torch.compile the model
seed = 1337                # fixes the initialization and the order of training batches
mfu_peak_flops = 0.0       # FLOP/s that MFU divides by; 0: model.GPU_PEAK_FLOPS for a GPU in it,
                           # else no MFU is printed

# {key: default}: every name above (not the imports)
DEFAULTS = {k: v for k, v in globals().items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str, type(None)))}
