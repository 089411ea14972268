# IWD's control: decay on the blocks' Input-Norm vectors, not on g_final (DESIGN.md).
#   python train.py config/iwd_blocks_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/iwd_blocks_char"
sv_weight_decay = 'iwd_blocks'
