"""export_hf.py: the exported Hugging Face model computes what the checkpoint computes (paper 2.2:
the Input-Norm vectors fold away), the refusals, and the GPT-2 tokenizer files. An independent
Llama forward (helpers.llama_forward) checks every export without transformers; transformers and
safetensors are test-only dependencies (requirements-test.txt), the second opinion: the tests that
need them are skipped without them, and the fast loop's summary says so (conftest.py)."""
import errno
import json
import os

import pytest
import torch

import checkpoint
from helpers import llama_forward
from tools import export_hf
import model as model_py
from model import GPT, GPTConfig

VARIANTS = {   # the paper's variants whose vectors all fold (design page), as GPTConfig flags
    "baseline": {},
    "noscale": {"scale_vectors": False},
    "HG": {"sv_hetero": True},
    "DP": {"sv_placement": "dp"},
    "OR": {"sv_reparam": "or"},
    "ER": {"sv_reparam": "er"},
    "HG+DP+OR": {"sv_hetero": True, "sv_placement": "dp", "sv_reparam": "or"},
    "qk_norm+HG+DP+ER": {"qk_norm": True, "sv_hetero": True, "sv_placement": "dp",
                         "sv_reparam": "er"},   # -> Qwen3
}
# vocab 100 is padded to 128 rows: the export must drop the 28 padded ones
TINY = dict(block_size=64, vocab_size=100, n_layer=2, n_head=4, n_embd=64)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Models this small run 10-50x faster on one thread than on two threads of a busy 2-core
    machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def randomized(cfg, seed=0):
    """A GPT whose scale vectors are far from 1 and whose weights give logits of order 1-10, so
    that a wrong fold, a missing vector or the wrong RoPE layout moves the logits by much more than
    1e-4."""
    model = GPT(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, cls in model.param_classes().items():
            p = model.get_parameter(name)
            if cls.startswith("sv_"):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen)
                        * (0.5 if cls == "embedding" else p.size(-1) ** -0.5))
    return model.eval()


def export_and_load(model, folder):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    config, state = export_hf.hf_export(model)
    export_hf.save(config, state, str(folder))
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32).eval()


@torch.no_grad()
def greedy(model, idx, steps):
    for _ in range(steps):
        idx = torch.cat((idx, model(idx)[0][:, -1:].argmax(-1)), dim=1)
    return idx


def probe(seed=1):
    return torch.randint(100, (2, 64), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_an_independent_llama_forward_over_the_export_gives_the_logits(variant, tied):
    """No transformers needed: the exported state dict and config, run by a Llama written from
    Hugging Face's definition (rotate_half RoPE, RMSNorm with the exported weights, SwiGLU, Qwen3's
    q/k norms), give the model's logits; its float64 against our float32: 1e-4."""
    model = randomized(GPTConfig(**TINY, tie_embeddings=tied, **VARIANTS[variant]))
    config, state = export_hf.hf_export(model)
    assert ("lm_head.weight" in state) != tied and len(state["model.embed_tokens.weight"]) == 100
    with torch.no_grad():
        ours = model(probe())[0]
    assert ours.abs().max() > 1   # logits of a size where a wrong export shows
    assert (llama_forward(config, state, probe()) - ours).abs().max().item() < 1e-4


def test_the_independent_forward_reads_the_safetensors_file(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    model = randomized(GPTConfig(**TINY, **VARIANTS["qk_norm+HG+DP+ER"]))
    export_hf.save(*export_hf.hf_export(model), str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    state = safetensors.load_file(str(tmp_path / "hf" / "model.safetensors"))
    with torch.no_grad():
        assert (llama_forward(config, state, probe()) - model(probe())[0]).abs().max() < 1e-4


@pytest.mark.parametrize("wrong", ["rope_order", "qk_norm_dropped", "vector_not_folded"])
def test_the_independent_forward_sees_a_wrong_export(monkeypatch, wrong):
    """It can fail: q and k exported in model.py's RoPE layout, Qwen3's q/k norm vectors dropped
    (issue 32: such an export passed when transformers was missing), or a vector left out of the
    fold each move the logits far beyond 1e-4."""
    model = randomized(GPTConfig(**TINY, **VARIANTS["qk_norm+HG+DP+ER"]))
    if wrong == "rope_order":
        monkeypatch.setattr(export_hf, "rope_order", lambda n_head, hd: torch.arange(n_head * hd))
    elif wrong == "qk_norm_dropped":
        monkeypatch.setattr(export_hf, "_vector", lambda module: None)
    else:
        sites = model_py.GPT.vector_sites   # DP's g_out forgotten by the fold
        monkeypatch.setattr(model_py.GPT, "vector_sites", lambda self: {
            n: s for n, s in sites(self).items() if not n.endswith("g_out")})
    config, state = export_hf.hf_export(model)
    with torch.no_grad():
        assert (llama_forward(config, state, probe()) - model(probe())[0]).abs().max() > 1e-2


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_export_matches_logits_and_greedy_tokens(variant, tied, tmp_path):
    model = randomized(GPTConfig(**TINY, tie_embeddings=tied, **VARIANTS[variant]))
    hf = export_and_load(model, tmp_path / "hf")
    assert type(hf).__name__ == ("Qwen3ForCausalLM" if model.config.qk_norm else "LlamaForCausalLM")
    # the padded rows are dropped: vocab_size rows, not padded_vocab
    assert (hf.get_input_embeddings().weight.shape == (100, 64)
            and hf.get_output_embeddings().weight.shape == (100, 64))
    # a tied head stays tied (g_final is in model.norm.weight); an untied one is written on its own
    assert (hf.get_output_embeddings().weight.data_ptr()
            == hf.get_input_embeddings().weight.data_ptr()) == tied
    idx = torch.randint(100, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(idx)[0], hf(idx).logits
    assert ours.abs().max() > 1   # logits of a size where a wrong export shows
    assert (theirs - ours).abs().max().item() < 1e-4
    prompt = idx[:1, :8]
    out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20,
                      min_new_tokens=20, do_sample=False, pad_token_id=0)
    assert out.tolist() == greedy(model, prompt, 20).tolist()


def test_without_the_rope_reordering_the_logits_differ(tmp_path, monkeypatch):
    """The test above can fail: Llama's rotary layout is not model.py's, and exporting q and k as
    they are moves the logits far beyond the 1e-4 tolerance."""
    monkeypatch.setattr(export_hf, "rope_order", lambda n_head, hd: torch.arange(n_head * hd))
    model = randomized(GPTConfig(**TINY))
    hf = export_and_load(model, tmp_path / "hf")
    idx = torch.randint(100, (1, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (hf(idx).logits - model(idx)[0]).abs().max().item() > 1e-2


def test_tied_export_keeps_g_final_in_the_final_norm():
    model = randomized(GPTConfig(**TINY))
    config, state = export_hf.hf_export(model)
    assert config["tie_word_embeddings"] and "lm_head.weight" not in state
    assert torch.equal(state["model.norm.weight"], model.g_final().reshape(-1))
    assert torch.equal(state["model.embed_tokens.weight"], model.wte.weight[:100])


@pytest.mark.parametrize("flags, named", [
    ({"sv_placement": "dnp"}, "sv_placement='dnp'"),
    # by the table's `norm`, not by a name
    ({"sv_placement": "dnp_novec"}, "sv_placement='dnp_novec'"),
    ({"post_norm": True}, "post_norm=True"),
    ({"n_experts": 4}, "n_experts=4"),
])
def test_refuses_what_is_not_a_plain_llama(flags, named):
    with pytest.raises(export_hf.ExportError,
                       match="^" + named.replace("(", r"\(").replace(")", r"\)")) as e:
        export_hf.hf_export(GPT(GPTConfig(**TINY, **flags)))
    assert "\n" not in str(e.value)


def test_gpt2_tokenizer_files_load_offline_and_match_tiktoken(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    export_hf.write_gpt2_tokenizer(str(tmp_path), 1024)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert tok("Hello world")["input_ids"] == [15496, 995]
    assert tok.eos_token_id == 50256 and len(tok) == 50257
    from dataset import ROOT, gpt2_encoding
    text = (ROOT / "data/raw/tinyshakespeare.txt").read_text(encoding="utf-8")[:5000]
    # multi-byte characters, runs of spaces
    text += " naïve café 日本語 🤖  \n\n\t 12345 it's  we'll   x"
    ids = gpt2_encoding().encode_ordinary(text)
    assert tok(text)["input_ids"] == ids and tok.decode(ids) == text


def write_run(folder, cfg, dataset, tokenizer):
    """A run folder as train.py leaves it (one checkpoint), and data/<dataset>/meta.json beside
    it."""
    model = randomized(cfg)
    model_args = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    checkpoint.save(str(folder / "out"), {"model": model.state_dict(), "optimizers": [],
                                          "model_args": model_args, "config": {"dataset": dataset},
                                          "iter_num": 7, "best_val_loss": 1.0}, 7)
    meta = {"tokenizer": tokenizer, "vocab_size": cfg.vocab_size}
    if tokenizer == "char":
        meta["chars"] = "".join(map(chr, range(33, 33 + cfg.vocab_size)))
    (folder / "data" / dataset).mkdir(parents=True)
    (folder / "data" / dataset / "meta.json").write_text(json.dumps(meta))
    return model


def test_command_exports_the_newest_checkpoint_with_its_tokenizer(tmp_path, monkeypatch, capsys):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = write_run(tmp_path,
                      GPTConfig(**{**TINY, "vocab_size": 50257, "n_embd": 32}, sv_hetero=True),
                      "web", "gpt2")
    (tmp_path / "hf" / "run").mkdir(parents=True)
    # an earlier export (its mark): replaced whole
    (tmp_path / "hf" / "run" / "model.safetensors").write_text("an earlier export")
    (tmp_path / "hf" / "run" / "export_hf.json").write_text("{}")
    export_hf.main(["--out_dir=out", "--to=hf/run"])
    printed = capsys.readouterr().out
    assert ("ckpt_0000007.pt" in printed and "50257 of 50304 vocabulary rows" in printed
            and "verify: max |logit difference|" in printed)
    assert sorted(os.listdir("hf/run")) == ["config.json", "export_hf.json", "merges.txt",
                                            "model.safetensors", "tokenizer_config.json",
                                            "vocab.json"]
    tok = transformers.AutoTokenizer.from_pretrained("hf/run")
    hf = transformers.AutoModelForCausalLM.from_pretrained("hf/run", dtype=torch.float32)
    idx = torch.tensor([tok("Hello world, said the model.")["input_ids"]])
    with torch.no_grad():
        assert (hf(idx).logits - model(idx)[0]).abs().max().item() < 1e-4


def test_command_refuses_with_one_sentence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, GPTConfig(**TINY, post_norm=True), "tiny", "char")
    with pytest.raises(SystemExit) as e:
        export_hf.main(["--out_dir=out", "--to=hf/run"])
    assert (str(e.value).startswith("error: post_norm=True cannot be exported")
            and "\n" not in str(e.value))
    assert not os.path.exists("hf/run")
    with pytest.raises(SystemExit, match="--to=hf/<name>"):
        export_hf.main(["--out_dir=out"])


def test_command_never_replaces_a_folder_that_is_not_an_export(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, GPTConfig(**TINY), "tiny", "char")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("mine")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for to, why in (
            # the run itself
            ("out", "exists and holds 2 file(s) an export does not write (e.g. ckpt_0000007.pt)"),
            ("notes", "exists and holds 1 file(s) an export does not write (e.g. README.md)"),
            ("out/latest", "is a file")):
        with pytest.raises(SystemExit) as e:
            export_hf.main(["--out_dir=out", f"--to={to}"])
        assert str(e.value) == f"error: --to={to} {why}" + (
            ", and an export replaces its folder whole: give a new folder" if why != "is a file"
            else ": give a folder for the export")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_an_export_replaces_only_an_earlier_export_it_recognizes(tmp_path, monkeypatch):
    """Issue 31.6: a folder that held only someone's config.json (a name an export writes) was
    replaced whole. An export is recognized by the mark it writes last, export_hf.json."""
    pytest.importorskip("safetensors")
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, GPTConfig(**TINY), "tiny", "char")
    for name in ("theirs", "old_export"):   # an export from before the mark alike
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"mine": 1}')
    (tmp_path / "old_export" / "model.safetensors").write_text("weights")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for to, held in (("theirs", "config.json"), ("old_export", "config.json, model.safetensors")):
        with pytest.raises(SystemExit) as e:
            export_hf.main(["--out_dir=out", f"--to={to}", "--verify=False"])
        assert str(e.value) == (f"error: --to={to} holds {held} but no export_hf.json, the mark "
                                "of an export this tool wrote, and an export replaces its folder "
                                "whole: give a new folder (or empty this one yourself)")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    (tmp_path / "empty").mkdir()
    for to in ("empty", "empty", "new"):   # an empty folder, then over its own export; a new one
        export_hf.main(["--out_dir=out", f"--to={to}", "--verify=False"])
        assert json.loads((tmp_path / to / "export_hf.json").read_text()) == {
            "written_by": "python -m tools.export_hf", "architecture": "LlamaForCausalLM"}


# ---- issue 20: the export writes only its own folder, and checks what it reads ------------------

def exported_state():
    return export_hf.hf_export(randomized(GPTConfig(**TINY)))


def test_an_export_never_deletes_a_folder_it_did_not_create(tmp_path):
    """`<--to>.old` and `<--to>.tmp` are someone's (a run named r.old): the export's temporary
    folders are its own."""
    pytest.importorskip("safetensors")
    for name in ("r.old", "r.tmp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ckpt_0000010.pt").write_text("a run")
    config, state = exported_state()
    for _ in range(2):   # a new folder, then over the earlier export
        export_hf.save(config, state, str(tmp_path / "r"))
    assert sorted(os.listdir(tmp_path)) == ["r", "r.old", "r.tmp"]
    assert all((tmp_path / n / "ckpt_0000010.pt").read_text() == "a run"
               for n in ("r.old", "r.tmp"))
    assert sorted(os.listdir(tmp_path / "r")) == ["config.json", "export_hf.json",
                                                  "model.safetensors"]


def test_a_failed_write_is_one_sentence_and_leaves_the_earlier_export(tmp_path, monkeypatch):
    pytest.importorskip("safetensors")
    import safetensors.torch
    config, state = exported_state()
    export_hf.save(config, state, str(tmp_path / "r"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()}

    def full_disk(*args, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(export_hf.ExportError,
                       match=r"^cannot write the export to .*r \(the disk is full\): "
                             r"what was there is as it was"):
        export_hf.save(config, state, str(tmp_path / "r"))

    def another_export_lands(path, *args, **kw):   # a second export to the same --to finishes first
        (tmp_path / "r2").mkdir()
        (tmp_path / "r2" / "config.json").write_text("the other export")
        open(path, "wb").close()
    monkeypatch.setattr(safetensors.torch, "save_file",
                        lambda state, path, **kw: another_export_lands(path))
    export_hf.save(config, state, str(tmp_path / "r2"))   # the last one wins, whole
    assert json.loads((tmp_path / "r2" / "config.json").read_text()) == config
    assert sorted(os.listdir(tmp_path)) == ["r", "r2"]   # no temporary folder left
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()} == before


def test_command_refuses_a_link_or_a_path_inside_a_file_as_to(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, GPTConfig(**TINY), "tiny", "char")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "README.md").write_text("mine")
    for to, why in (("link", "is a symbolic link"), ("README.md/x", "is inside"),
                    ("README.md/x/y", "which is a file")):
        with pytest.raises(SystemExit) as e:
            export_hf.main(["--out_dir=out", f"--to={to}"])
        assert (str(e.value).startswith(f"error: --to={to} ") and why in str(e.value)
                and "\n" not in str(e.value))
    assert (tmp_path / "link").is_symlink() and os.listdir(tmp_path / "elsewhere") == []


def test_command_refuses_a_nan_checkpoint_and_a_nan_verification(tmp_path, monkeypatch):
    pytest.importorskip("safetensors")
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, GPTConfig(**TINY), "tiny", "char")
    monkeypatch.setattr(export_hf, "compare", lambda model, folder: (float("nan"), 0.0))
    with pytest.raises(SystemExit,
                       match="^error: the export's logits differ from the checkpoint's by nan"):
        export_hf.main(["--out_dir=out", "--to=hf/run"])
    state = checkpoint.load_latest("out")[1]
    state["model"]["wte.weight"][0, 0] = float("nan")
    checkpoint.save("out", state, 8)
    with pytest.raises(SystemExit, match=r"^error: checkpoint out/ckpt_0000008.pt holds "
                                         r"non-finite weights \(wte.weight\)"):
        export_hf.main(["--out_dir=out", "--to=hf/run2"])
    assert not os.path.exists("hf/run2")


def test_the_tokenizer_is_the_runs_not_todays_meta_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, GPTConfig(**TINY), "tiny", "char")
    state = checkpoint.load_latest("out")[1]
    # a checkpoint without the record: from meta.json
    assert export_hf.tokenizer_of(state) == "char"
    state["vocab"] = {"tokenizer": "gpt2", "vocab_size": 50257}
    # the run's own record wins over today's meta.json
    assert export_hf.tokenizer_of(state) == "gpt2"
    state["vocab"] = {"tokenizer": "byte", "vocab_size": 257}
    assert export_hf.tokenizer_of(state) == "byte"


def test_a_byte_run_exports_without_tokenizer_files(tmp_path, monkeypatch, capsys):
    """As a char run: HF has no tokenizer class for our 257 ids, so only the model is written."""
    pytest.importorskip("safetensors")
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, GPTConfig(**{**TINY, "vocab_size": 257}), "bytes", "byte")
    export_hf.main(["--out_dir=out", "--to=hf/run", "--verify=False"])
    assert sorted(os.listdir("hf/run")) == ["config.json", "export_hf.json", "model.safetensors"]
    assert "tokenizer: none written (byte-level" in capsys.readouterr().out
