"""
Export a trained run to Hugging Face format: a plain Llama (or Qwen3), its scale vectors folded.

    python -m tools.export_hf --out_dir=out/<run> --to=hf/<name>

Needs --to (a new or empty folder, or an earlier export, which it replaces whole) and the
safetensors package (pip install safetensors: it is in requirements-test.txt, not in
requirements.txt). Refuses unified and DNP runs (sv_placement='dnp'): their g_out acts after a
Norm of the map's output, not before a linear map, so it cannot fold into a weight, and Llama has
no such norm; post_norm likewise (a Norm of each branch), and MoE (its FFN is not Llama's).

Paper, section 2.2: an Input-Norm scale vector adds no expressivity, W (g * z) = (W diag(g)) z, so
GPT.fold_scale_vectors() turns a model trained with HG, DP, OR or ER (or none) into an equivalent
one with no scale vector at all. That model is a standard LlamaForCausalLM once three layout
details match:
  - RoPE: model.py rotates adjacent channel pairs (2i, 2i+1) of a head, Llama's rotate_half rotates
    the halves (i, i + hd/2); reordering the rows of q and k in each head to
    [0, 2, 4, ..., 1, 3, 5, ...] makes the two the same (q.k is unchanged when q and k are
    reordered alike);
  - norms: Llama's RMSNorm is weight * x / sqrt(mean(x^2) + eps), so its weights are 1 (the vectors
    are folded) and rms_norm_eps = norm_eps; a tied head keeps g_final in the final norm's weight
    instead, since folding it into the head would untie it (a vector that folds into the
    embedding does untie it: keeps_tie);
  - vocabulary: the rows added by vocab_pad are dropped (vocab_size rows are written): no token id
    points at them and model.py never returns their logits (its loss's softmax does include them:
    see --verify).
qk_norm (g_q * Norm(q), g_k * Norm(k) per head, one vector shared by the heads, before RoPE) is
exactly Qwen3's q_norm / k_norm, so such a model is written as a Qwen3ForCausalLM. Besides DNP,
post_norm and MoE (whose FFN is not a Llama one), any other vector that declares a Norm after it
(GPT.vector_sites) is refused, and a weight BLOCK_WEIGHTS does not place.

Writes config.json, model.safetensors (float32) and the run's tokenizer: for GPT-2's BPE
vocab.json and merges.txt (built offline from data/raw/gpt2.tiktoken), for characters or bytes a
tokenizer.json of one token per character (byte), so that AutoTokenizer.from_pretrained /
AutoModelForCausalLM.from_pretrained load the folder with no network and generate on their own.
With transformers installed, --verify compares the export's logits with the checkpoint's.
"""
import errno
import functools
import json
import os
import sys
import tempfile
from dataclasses import replace

import torch

import checkpoint
from config.defaults import at_least, boolean, folder
from configurator import ConfigError, configure, key_comments
from model import GPT, PLACEMENTS
from runtime import setup_cpu
# gpt2_encoding checks the vendored file's sha256
from tokenizer import BYTE_EOT, EOT, gpt2_encoding

out_dir = "out"   # the run: its newest complete checkpoint is exported
to = ""           # the folder to write: new, empty or an earlier export (replaced whole)
verify = True     # load the export with transformers (if installed) and compare logits on a probe
cpu_threads = 0   # torch's threads; 0: the cores idle at start, as train.py's

# The one place that knows model.py's names. Keys: state_dict names of the *folded* GPT (per block
# after "blocks.{i}."), values: the Hugging Face names of their equal row blocks (a fused weight is
# split).
BLOCK_WEIGHTS = {
    "attn.qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                        "self_attn.v_proj.weight"),
    "attn.proj.weight": ("self_attn.o_proj.weight",),
    "mlp.gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.down.weight": ("mlp.down_proj.weight",),
}
# rows reordered to Llama's RoPE layout
ROPE_ROWS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight")
EMBEDDING, HEAD = "wte.weight", "head.weight"
FINAL_VECTOR = "g_final"   # GPT attribute: a ScaleVector or None
# OutputNorm modules
QK_NORMS = {"attn.q_norm": "self_attn.q_norm.weight", "attn.k_norm": "self_attn.k_norm.weight"}
GPT2_VOCAB = 50257


class ExportError(ValueError):
    """A model that has no exact Hugging Face equivalent, or a run that cannot be exported."""


def check_exportable(cfg):
    """Raise ExportError, one sentence naming the flag or the vector, if cfg is not a plain Llama
    (or Qwen3) once folded: every scale vector must fold, as it declares (GPT.vector_sites), but
    Qwen3's q/k norms."""
    why = ("a Norm, not a linear map, follows its scale vectors, so they cannot fold and Llama has "
           "no such norm")
    if cfg.scale_vectors and PLACEMENTS[cfg.sv_placement].norm:
        raise ExportError(f"sv_placement={cfg.sv_placement!r} cannot be exported: {why} "
                          "(a Norm follows W x)")
    if cfg.post_norm:
        raise ExportError(f"post_norm=True cannot be exported: {why} "
                          "(it normalizes each branch's output)")
    if cfg.n_experts:
        raise ExportError(f"n_experts={cfg.n_experts} cannot be exported: the MoE FFN (router, "
                          "expert bias, shared experts) is not a Llama MLP; export a dense model "
                          "(n_experts=0)")
    with torch.device("meta"):   # sizes only
        sites = GPT(cfg).vector_sites()
    qk = tuple(f".{m}.g" for m in QK_NORMS)
    for name in (n for n, s in sites.items() if not s and not n.endswith(qk)):
        raise ExportError(f"{name} cannot be exported: it declares a Norm, not a linear map, after "
                          "it, so it cannot fold and Llama has no such norm")


def rope_order(n_head, hd):
    """Row order that turns model.py's RoPE layout (pairs 2i, 2i+1) into Llama's
    (pairs i, i + hd/2), per head."""
    within = torch.cat((torch.arange(0, hd, 2), torch.arange(1, hd, 2)))
    return (torch.arange(n_head)[:, None] * hd + within).flatten()


def _fold(model):
    """model.fold_scale_vectors(), also for qk_norm: fold_scale_vectors refuses qk_norm as a whole
    because its vectors cannot fold, but every other vector of such a model still folds; the q/k
    vectors become Qwen3's q_norm / k_norm weights, so fold a copy of the model without them."""
    cfg = model.config
    if not cfg.qk_norm:
        return model.fold_scale_vectors()
    twin = GPT(replace(cfg, qk_norm=False)).to(next(model.parameters()).device)
    own = twin.state_dict()
    state = {k: v for k, v in model.state_dict().items() if k in own}
    # strict: the twin holds exactly the model's weights but the q/k vectors
    twin.load_state_dict(state)
    return twin.fold_scale_vectors()


def keeps_tie(model):
    """Whether the export keeps a tied head tied, g_final in the final norm's weight: only if no
    other vector folds into the embedding or the head (GPT.vector_sites), since folded, each would
    hold its own vectors and the two would differ; the export then unties them."""
    return model.config.tie_embeddings and not any(
        key in (EMBEDDING, HEAD) for name, sites in model.vector_sites().items()
        if name != FINAL_VECTOR for key, _ in sites)


def _vector(module):
    """The effective scale vector of an OutputNorm / ScaleVector holder, or None
    (scale_vectors=False)."""
    g = module.g if hasattr(module, "g") else module
    return None if g is None else g().reshape(-1)


@torch.no_grad()
def hf_export(model):
    """(config dict, state dict) of the Hugging Face model equal to `model` (a GPT), float32, on the
    CPU."""
    cfg = model.config
    check_exportable(cfg)
    plain = _fold(model).cpu().float()
    folded = plain.state_dict()
    d, hd, V = cfg.n_embd, cfg.n_embd // cfg.n_head, cfg.vocab_size
    order = rope_order(cfg.n_head, hd)
    ones = torch.ones(d)
    state = {"model.embed_tokens.weight": folded[EMBEDDING][:V]}   # padded rows dropped
    for i in range(cfg.n_layer):
        for name, hf_names in BLOCK_WEIGHTS.items():
            for hf_name, w in zip(hf_names,
                                  folded[f"blocks.{i}.{name}"].chunk(len(hf_names), dim=0)):
                state[f"model.layers.{i}.{hf_name}"] = w[order] if hf_name in ROPE_ROWS else w
        state[f"model.layers.{i}.input_layernorm.weight"] = ones   # g_attn is folded into q, k, v
        state[f"model.layers.{i}.post_attention_layernorm.weight"] = ones   # g_ffn into gate, up
        # Qwen3: one head-sized vector shared by the heads, like model.py's; RoPE order too
        if cfg.qk_norm:
            mods = dict(model.named_modules())
            for name, hf_name in QK_NORMS.items():
                g = _vector(mods[f"blocks.{i}.{name}"])
                state[f"model.layers.{i}.{hf_name}"] = (
                    torch.ones(hd) if g is None else g.float().cpu())[order[:hd]]
    g_final, tied = getattr(model, FINAL_VECTOR), keeps_tie(model)
    if tied:
        # keep the tie: g_final goes into the final norm's weight, not into the head
        state["model.norm.weight"] = (ones if g_final is None
                                      else g_final().reshape(-1).float().cpu())
    else:
        # untied, by the config or by keeps_tie: the folded head holds W_head diag(g_final)
        state["model.norm.weight"] = ones
        state["lm_head.weight"] = folded[HEAD][:V]
    mapped = {EMBEDDING, HEAD,
              *(f"blocks.{i}.{k}" for i in range(cfg.n_layer) for k in BLOCK_WEIGHTS)}
    for key in sorted(set(folded) - mapped)[:1]:   # a fork's new weight would be dropped
        raise ExportError(f"{key} has no place in a Llama: say in export_hf.BLOCK_WEIGHTS where "
                          "it goes, or export a model without it")
    state = {k: v.contiguous().clone() for k, v in state.items()}
    arch = "Qwen3" if cfg.qk_norm else "Llama"
    config = {
        "architectures": [f"{arch}ForCausalLM"], "model_type": arch.lower(),
        "vocab_size": V, "hidden_size": d, "intermediate_size": cfg.hidden,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head, "head_dim": hd,
        "hidden_act": "silu", "max_position_embeddings": cfg.block_size,
        "rms_norm_eps": cfg.norm_eps,
        # transformers < 5 reads rope_theta, >= 5 rope_parameters
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": tied, "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        "torch_dtype": "float32",
    }
    if cfg.qk_norm:
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layer,
                      layer_types=["full_attention"] * cfg.n_layer)
    if V == GPT2_VOCAB:
        config.update(bos_token_id=GPT2_VOCAB - 1, eos_token_id=GPT2_VOCAB - 1)
    return config, state


# ---- GPT-2 tokenizer files, from the vendored ranks ----------------------------------------------

def _bytes_to_unicode():
    """GPT-2's map from the 256 bytes to printable characters, in which vocab.json and merges.txt
    are written."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@functools.lru_cache
def gpt2_vocab_merges():
    """(vocab, merges) of GPT-2's BPE in the format of vocab.json / merges.txt. The ranks file holds
    only the merged tokens, in merge order; the merge that made token t (rank r) is the pair of
    pieces that byte-pair merging of t with the ranks below r stops at (as tiktoken's educational
    bpe does)."""
    enc = gpt2_encoding()
    ranks = {enc.decode_single_token_bytes(r): r for r in range(EOT)}
    show = _bytes_to_unicode()
    text = lambda b: "".join(show[x] for x in b)
    merges = []
    for token, rank in ranks.items():
        splits = [(token[:i], token[i:]) for i in range(1, len(token))
                  if ranks.get(token[:i], rank) < rank and ranks.get(token[i:], rank) < rank]
        # one split into two earlier tokens: it is the merge; several: replay the merging to
        # find which
        parts = list(splits[0]) if len(splits) == 1 else [bytes([b]) for b in token]
        while len(parts) > 2:
            pairs = [(ranks.get(a + b, rank), j) for j, (a, b) in enumerate(zip(parts, parts[1:]))]
            best, j = min(pairs)
            if best >= rank:
                raise ExportError(f"GPT-2 token {rank} cannot be built from earlier merges: "
                                  "data/raw/gpt2.tiktoken is not a BPE ranks file")
            parts[j:j + 2] = [parts[j] + parts[j + 1]]
        if len(parts) == 2:
            merges.append((rank, f"{text(parts[0])} {text(parts[1])}"))
    vocab = {text(token): rank for token, rank in ranks.items()}
    vocab["<|endoftext|>"] = EOT
    return vocab, [m for _, m in sorted(merges)]


def write_gpt2_tokenizer(folder, model_max_length):
    vocab, merges = gpt2_vocab_merges()
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    eot = "<|endoftext|>"
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "bos_token": eot, "eos_token": eot,
                   "unk_token": eot, "add_prefix_space": False, "add_bos_token": False,
                   "model_max_length": model_max_length}, f, indent=2)


# ---- a character or byte vocabulary as a tokenizer.json (the `tokenizers` library's format) ------

def vocab_tokenizer(vocab):
    """tokenizer.json of a char- or byte-level run: a WordLevel vocabulary of its ids, the text
    split into one character (or byte) each, which the decoder joins back. A byte's token is its
    printable stand-in of GPT-2's map; the byte-level decoder turns a cut or invalid UTF-8
    sequence into U+FFFD, as tokenizer.py does."""
    one_each = {"type": "Split", "pattern": {"Regex": r"[\s\S]"}, "behavior": "Isolated",
                "invert": False}
    model = {"type": "WordLevel", "unk_token": "<unk>",   # not in it: an unknown character fails
             "vocab": {c: i for i, c in enumerate(vocab.get("chars", ""))}}
    pre, decoder, added = one_each, {"type": "Fuse"}, []
    if vocab["tokenizer"] == "byte":
        show, level = _bytes_to_unicode(), {"add_prefix_space": False, "trim_offsets": True,
                                            "use_regex": False}
        model["vocab"] = {**{show[b]: b for b in range(256)}, "<|endoftext|>": BYTE_EOT}
        pre = {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", **level}, one_each]}
        decoder = {"type": "ByteLevel", **level}
        added = [{"id": BYTE_EOT, "content": "<|endoftext|>", "single_word": False,
                  "lstrip": False, "rstrip": False, "normalized": False, "special": True}]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
            "decoder": decoder, "model": model}


def write_tokenizer(folder, vocab, model_max_length):
    """The run's tokenizer (its recorded vocabulary), in files that AutoTokenizer loads; nothing
    for a tokenizer of a fork's that this does not know."""
    if vocab.get("tokenizer") == "gpt2":
        return write_gpt2_tokenizer(folder, model_max_length)
    if vocab.get("tokenizer") not in ("char", "byte"):
        return
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(vocab_tokenizer(vocab), f, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:   # spaces kept as they are
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length":
                   model_max_length, "clean_up_tokenization_spaces": False,
                   **({"eos_token": "<|endoftext|>"} if vocab["tokenizer"] == "byte" else {})},
                  f, indent=2)


# ---- the command ---------------------------------------------------------------------------------

# written last into every export: what tells an earlier export from a folder that only holds
# files of the same names (someone's config.json)
MARK = "export_hf.json"
EXPORT_FILES = {"model.safetensors", "config.json", "vocab.json", "merges.txt", "tokenizer.json",
                "tokenizer_config.json", MARK}


def check_target(folder):
    """--to may name a new or empty folder or an earlier export (its MARK), which save() replaces
    whole; never anything else (a run's out_dir, a home directory, someone's config.json, a link
    to somewhere): ConfigError naming what is there."""
    if os.path.islink(folder):
        raise ConfigError(f"--to={folder} is a symbolic link (to {os.readlink(folder)}), and an "
                          "export replaces its folder whole: give the folder itself")
    above = os.path.dirname(os.path.abspath(folder))
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise ConfigError(f"--to={folder} is inside {above}, which is a file: give a folder for "
                          "the export")
    if not os.path.exists(folder):
        return
    if not os.path.isdir(folder):
        raise ConfigError(f"--to={folder} is a file: give a folder for the export")
    other = sorted(set(os.listdir(folder)) - EXPORT_FILES)
    if other:
        raise ConfigError(f"--to={folder} exists and holds {len(other)} file(s) an export does not "
                          f"write (e.g. {other[0]}), and an export replaces its folder whole: give "
                          "a new folder")
    held = sorted(os.listdir(folder))
    if held and MARK not in held:
        raise ConfigError(f"--to={folder} holds {', '.join(held)} but no {MARK}, the mark of an "
                          "export this tool wrote, and an export replaces its folder whole: give a "
                          "new folder (or empty this one yourself)")


def save(config, state, folder, vocab=None, block_size=1024):
    """Write the export into `folder`, replacing it whole. The files go to a folder beside it that
    this writer creates under a name no other has (tempfile.mkdtemp), then take `folder`'s name: an
    interrupted or failed export leaves the previous one as it was, and nothing this call did not
    create is ever deleted (an `<--to>.old` or `<--to>.tmp` beside it is someone's). ExportError,
    one sentence, for a failed write."""
    from safetensors.torch import save_file
    folder = os.path.normpath(folder)
    parent = os.path.dirname(folder) or "."
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.export-", dir=parent)
        save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        write_tokenizer(tmp, vocab or {}, block_size)
        with open(os.path.join(tmp, MARK), "w") as f:   # last: a whole export (check_target)
            json.dump({"written_by": "python -m tools.export_hf",
                       "architecture": config["architectures"][0]}, f, indent=2)
        _swap_in(tmp, folder)
    except Exception as e:   # OSError, or safetensors' own error around one
        why = "the disk is full" if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) else \
              (e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}")
        if getattr(e, "errno", None) in (errno.ENOTEMPTY, errno.EEXIST):
            why = "another export wrote it at the same moment"
        raise ExportError(f"cannot write the export to {folder} ({why}): what was there is as it "
                          "was; fix that and export again") from None
    finally:
        if tmp and os.path.isdir(tmp):
            _remove_export(tmp)


def _swap_in(tmp, folder):
    """Give `tmp` the name `folder`; an earlier export there is moved aside first (into an empty
    folder made for it: rename replaces an empty folder) and its files removed. Fails, restoring the
    earlier export, if another export took the name meanwhile (rename onto a folder that is not
    empty)."""
    aside = None
    if os.path.isdir(folder):
        aside = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.previous-",
                                 dir=os.path.dirname(tmp))
        os.replace(folder, aside)
    try:
        os.rename(tmp, folder)
    except OSError:
        if aside:
            try:
                os.rename(aside, folder)
                aside = None
            except OSError:   # another export holds the name now: that one stays
                pass
        raise
    finally:
        if aside:
            _remove_export(aside)


def _remove_export(d):
    """Remove a folder of export files that this module wrote, by their names only, then the folder
    if empty."""
    for name in EXPORT_FILES:
        try:
            os.remove(os.path.join(d, name))
        except FileNotFoundError:
            pass
    try:
        os.rmdir(d)
    except OSError:
        pass


@torch.no_grad()
def compare(model, folder, n_tokens=64, seed=0):
    """Load the export with transformers and return (max |logit difference|, loss difference) on a
    random probe: the loss difference is what the dropped padded rows took of model.py's softmax
    (>= 0)."""
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(cfg.vocab_size, (1, min(n_tokens, cfg.block_size) + 1), generator=gen)
    model = model.float().cpu().eval()
    logits, loss = model(idx[:, :-1], idx[:, 1:])
    hf_logits = hf(idx[:, :-1]).logits
    sliced = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[0, 1:])
    return (hf_logits - logits).abs().max().item(), (loss - sliced).item()


# the values each key allows, for --help and the checks
RULES = {"out_dir": folder, "verify": boolean, "cpu_threads": at_least(0),
         "to": (lambda v: True, "required; never a run's out_dir or a folder of other files")}


def main(argv):
    defaults = {"out_dir": out_dir, "to": to, "verify": verify, "cpu_threads": cpu_threads}
    try:
        args = configure(defaults, argv, RULES, usage=__doc__,
                         comments=lambda: key_comments(__file__))
        if not args["to"]:
            raise ConfigError("say where to write the export: --to=hf/<name>")
        check_target(args["to"])
        setup_cpu(args["cpu_threads"])   # the export folds and verifies on the CPU
        path, ckpt, model = checkpoint.load_model(args["out_dir"])
        config, state = hf_export(model.eval())   # a refusal first: safetensors would not help
        try:
            import safetensors  # noqa: F401
        except ImportError:
            raise ConfigError("export_hf.py writes model.safetensors and needs safetensors: pip "
                              "install safetensors (it is in requirements-test.txt)") from None
    except ExportError as e:   # ConfigError, CheckpointError: SystemExits of their own sentence
        sys.exit(f"error: {e}")
    tok = ckpt["vocab"].get("tokenizer")   # what the run's data was prepared with, as recorded
    if tok == "gpt2" and model.config.vocab_size != GPT2_VOCAB:
        sys.exit("error: the run's data is GPT-2 BPE but the model has "
                 f"vocab_size={model.config.vocab_size}, not {GPT2_VOCAB}")
    try:
        save(config, state, args["to"], ckpt["vocab"], model.config.block_size)
    except ExportError as e:
        sys.exit(f"error: {e}")
    c = model.config
    print(f"{path} (iteration {ckpt.get('iter_num')}) -> {args['to']}: "
          f"{config['architectures'][0]}, "
          f"{c.vocab_size} of {c.padded_vocab} vocabulary rows (the padding is dropped), "
          "head " + ('tied, g_final in model.norm.weight' if config["tie_word_embeddings"]
                     else 'untied, g_final folded into lm_head'))
    print({"gpt2": "tokenizer: GPT-2 BPE (vocab.json, merges.txt)",
           "char": f"tokenizer: the run's {c.vocab_size} characters, one token each "
                   "(tokenizer.json)",
           "byte": "tokenizer: UTF-8 bytes, one token each, 256 ends a text (tokenizer.json)",
           }.get(tok, f"tokenizer: none written ({tok!r})"))
    if args["verify"]:
        try:
            diff, pad = compare(model, args["to"])
        except ImportError:
            print("verify: skipped (pip install transformers to compare the export's logits with "
                  "the checkpoint's)")
        else:
            print(f"verify: max |logit difference| {diff:.2e} on a random probe (float32); "
                  f"the dropped padded rows held {pad:.2e} nats of model.py's loss there")
            if not diff <= 1e-3:   # NaN too
                sys.exit(f"error: the export's logits differ from the checkpoint's by {diff:.2e}: "
                         f"report this with your config; the export in {args['to']} is not "
                         "equivalent")


if __name__ == "__main__":
    main(sys.argv[1:])
