# IWD's control on the Gemma-like norms (our choice): decay the blocks' Input-Norm vectors, not
# g_final before the head (study/grids.py's iwd grid).
#   python train.py config/gemma_iwd_blocks_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/gemma_iwd_blocks_char"
qk_norm = True
post_norm = True
sv_weight_decay = 'iwd_blocks'
