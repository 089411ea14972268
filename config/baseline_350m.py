# The baseline at GPT-2 medium's sizes (24 layers, 16 heads, 1024 wide, block 1024: 355M parameters
# with tied embeddings), so that a node can check the paper's claim that unified's gain holds, or
# grows, with scale (paper 4: 0.12B to 2B) at a second size. Same data, tokens per step and schedule
# shape as baseline_124m; the learning rate is the usual one for this size: 3e-4 (GPT-3's table 2.1
# for 350M, half of the 6e-4 of 124M), ending at a tenth. 10B tokens (sample-10BT once) is ~28
# tokens per parameter; the paper's ~100 would be --tokens=35e9 on sample-100BT.
#   torchrun --standalone --nproc_per_node=8 train.py config/baseline_350m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/baseline_350m"
batch_size = 8                        # per GPU and micro-step: fits 40 GB GPUs in bf16
gradient_accumulation_steps = 8 * 8   # 8 * 1024 * 64 = 524,288 tokens per step over 8 GPUs

n_layer = 24
n_head = 16
n_embd = 1024

learning_rate = 3e-4
min_lr = 3e-5
