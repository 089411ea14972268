"""
Tools around training, each run from the repository's root as `python -m tools.NAME` (its
docstring says how):

    bench         ms/step, tokens/s, MFU and peak memory of configs side by side
    gpu_check     one command that checks a CUDA machine (--device=cpu rehearses it)
    export_hf     a run, its vectors folded, as a Hugging Face Llama (or Qwen3) checkpoint
    plot_metrics  a PNG of runs' metrics: losses, scale vectors, MoE load

They import the core (model.py, checkpoint.py, dataset.py, configurator.py, config/defaults.py),
never the study (study/) nor each other.
"""
