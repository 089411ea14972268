"""export_hf.py: its files compute the model's logits; a refusal: one sentence, nothing changed."""
import errno
import json
import math
import os
from pathlib import Path

import pytest
import torch

import checkpoint
import model as model_py
from dataset import vocabulary
from tokenizer import get_tokenizer, gpt2_encoding
from helpers import (ROOT, VARIANTS, entries, llama_forward, make, models,
                     randomize_scale_vectors, tokens, vectors)
from tools import export_hf

# vocab 100 is padded to 128 rows: the export must drop the 28 padded ones
TINY = dict(block_size=64, vocab_size=100, n_layer=2, n_head=4, n_embd=64)
TEXT = "First Citizen:\nBefore we proceed any further, hear me. naïve 日本語 🤖  \n\t it's"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch, one_thread):   # one_thread: conftest's
    monkeypatch.chdir(tmp_path)


def files():   # every file under the test's folder, and its bytes
    return {p: p.read_bytes() for p in Path().rglob("*") if p.is_file()}


def write_run(tokenizer="char", **flags):
    """out/ as train.py leaves it; vectors far from 1, logits of order 10: a wrong export shows."""
    cfg = model_py.GPTConfig(**{**TINY, **flags})
    model, gen = model_py.GPT(cfg).eval(), torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, cls in model.param_classes().items():
            p = model.get_parameter(name)
            noise = torch.randn(p.shape, generator=gen)
            p.add_(0.3 * noise) if cls.startswith("sv_") else p.copy_(
                noise * (0.5 if cls == "embedding" else p.size(-1) ** -0.5))
    chars = "".join(map(chr, range(33, 33 + cfg.vocab_size)))   # for a char-level vocabulary
    vocab = vocabulary(dict(tokenizer=tokenizer, vocab_size=cfg.vocab_size, chars=chars))
    checkpoint.save("out", dict(model=model.state_dict(), optimizers=[], config={}, vocab=vocab,
                                model_args=vars(cfg), iter_num=7, best_val_loss=1.0))
    return model


@pytest.mark.parametrize("arch, flags, tokenizer, written", [
    ("Llama", dict(vocab_size=50257, n_embd=32, sv_hetero=True), "gpt2", "GPT-2 BPE"),
    ("Qwen3", dict(qk_norm=True, sv_hetero=True, sv_placement="dp", sv_reparam="er",
                   tie_embeddings=False), "char", "the run's 100 characters, one token each"),
    ("Llama", dict(vocab_size=257), "byte", "UTF-8 bytes, one token each")])
def test_the_export_gives_the_models_logits(arch, flags, tokenizer, written, monkeypatch, capsys):
    safetensors = pytest.importorskip("safetensors.torch")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = write_run(tokenizer, **flags)
    os.makedirs("hf")   # an empty folder; hf.old beside it is someone's (a run)
    os.makedirs("hf.old")
    Path("hf.old/ckpt_0000010.pt").write_text("a run")
    export_hf.main(["--out_dir=out", "--to=hf"])
    out, V, tied = capsys.readouterr().out, model.config.vocab_size, model.config.tie_embeddings
    assert f"ckpt_0000007.pt (iteration 7) -> hf: {arch}ForCausalLM, {V} of " in out
    assert f"tokenizer: {written}" in out and "verify: " in out
    assert sorted(os.listdir("hf")) == sorted([
        "config.json", "export_hf.json", "model.safetensors",
        "tokenizer_config.json", *(["merges.txt", "vocab.json"] if tokenizer == "gpt2"
                                   else ["tokenizer.json"])])
    config, state = json.load(open("hf/config.json")), safetensors.load_file("hf/model.safetensors")
    assert ("lm_head.weight" in state) != tied and len(state["model.embed_tokens.weight"]) == V
    idx = torch.randint(V, (2, 64), generator=torch.Generator().manual_seed(1))
    assert (ours := model(idx)[0].detach()).abs().max() > 10   # where a wrong export shows
    # llama_forward in float64 against our float32: 1e-4 (measured: 1.2e-5)
    assert (llama_forward(config, state, idx) - ours).abs().max() < 1e-4
    # it sees a wrong export: q, k in model.py's RoPE layout, no q/k norms, no DP g_out
    sites = model_py.GPT.vector_sites
    for where, name, wrong in [] if tied else [
            (export_hf, "rope_order", lambda n_head, hd: torch.arange(n_head * hd)),
            (export_hf, "_vector", lambda module: None), (model_py.GPT, "vector_sites",
             lambda self: {n: s for n, s in sites(self).items() if "g_out" not in n})]:
        with monkeypatch.context() as m:
            m.setattr(where, name, wrong)
            assert (llama_forward(*export_hf.hf_export(model), idx) - ours).abs().max() > 1e-2
    export_hf.main(["--out_dir=out", "--to=hf", "--verify=False"])   # over its own export
    written = files()
    monkeypatch.setattr(safetensors, "save_file", lambda *a, **kw: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    with pytest.raises(SystemExit, match=r"^error: cannot write the export to hf \(the disk is "
                                         r"full\): what was there is as it was"):
        export_hf.main(["--out_dir=out", "--to=hf", "--verify=False"])
    assert files() == written and Path("hf.old/ckpt_0000010.pt").read_text() == "a run"
    assert sorted(os.listdir()) == ["hf", "hf.old", "out"]   # no temporary folder left
    transformers = pytest.importorskip("transformers")   # the second opinion, from the files
    hf = transformers.AutoModelForCausalLM.from_pretrained("hf", dtype=torch.float32).eval()
    assert type(hf).__name__ == f"{arch}ForCausalLM" and tied == (
        hf.lm_head.weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr())
    assert (hf(idx).logits.detach() - ours).abs().max() < 1e-4
    if tokenizer == "gpt2":   # built offline from data/raw/gpt2.tiktoken: the same ids
        tok, ids = transformers.AutoTokenizer.from_pretrained("hf"), gpt2_encoding().encode(TEXT)
        assert tok(TEXT)["input_ids"] == ids and tok.decode(ids) == TEXT


@pytest.mark.parametrize("tokenizer, prompt", [("char", "ROMEO:"),
                                               ("byte", "h\u00e9 \u65e5\u672c")])
def test_the_export_generates_and_decodes_on_its_own(tokenizer, prompt, monkeypatch, capsys):
    """AutoTokenizer and AutoModelForCausalLM from the folder alone: the greedy text of model.py's
    generate, decoded by tokenizer.py; README's example runs on it."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = write_run(tokenizer, vocab_size=257 if tokenizer == "byte" else 100)
    export_hf.main(["--out_dir=out", "--to=hf", "--verify=False"])
    tok = transformers.AutoTokenizer.from_pretrained("hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained("hf", dtype=torch.float32)
    encode, decode = get_tokenizer(checkpoint.load_latest("out")[1]["vocab"])
    ids = tok(prompt, return_tensors="pt").input_ids
    assert ids[0].tolist() == encode(prompt), "tokenizer.json encodes otherwise than tokenizer.py"
    # the prompt, then 8 random ids a row: 8 contexts (a random model's greedy text soon repeats)
    g = torch.Generator().manual_seed(2)
    idx = torch.cat((ids.expand(8, -1), torch.randint(model.config.vocab_size, (8, 8),
                                                      generator=g)), 1)
    ours = model.generate(idx, 24, temperature=0)
    theirs = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=24,
                         do_sample=False)
    assert len({tuple(row[idx.size(1):]) for row in ours.tolist()}) > 3   # 8 texts that differ
    assert theirs.tolist() == ours.tolist()
    assert [tok.decode(row, skip_special_tokens=True) for row in theirs] == [
        decode(row) for row in ours.tolist()]
    if tokenizer == "char":   # the README's lines, on this export
        readme = (Path(ROOT) / "README.md").read_text(encoding="utf-8")
        code = next(c for c in readme.split("```")[1::2] if "AutoTokenizer" in c)
        capsys.readouterr()
        exec(code.removeprefix("python").replace("hf/shakespeare_char", "hf"), {})
        assert capsys.readouterr().out.startswith("ROMEO:")


@pytest.mark.parametrize("case, to, message", [   # a model's other refusals: the last test
    ("unified", "hf", "sv_placement='dnp' cannot be exported: a Norm, not a linear map, follows"),
    ("", "", "say where to write the export: --to=hf/<name>"),
    ("", "out", "--to=out exists and holds "),   # a run: files an export does not write
    ("", "theirs", "--to=theirs holds config.json but no export_hf.json, the mark of an export"),
    ("", "out/latest/x", "--to=out/latest/x is inside"), ("", "link", "--to=link is a"),
    ("nan logits", "hf", "the export's logits differ from the checkpoint's by nan")])
def test_what_cannot_be_exported_is_one_sentence_changing_nothing(case, to, message, monkeypatch):
    write_run(**(VARIANTS["unified"] if case == "unified" else {}))
    os.mkdir("theirs")   # someone's file
    Path("theirs/config.json").write_text("mine")
    os.symlink("out", "link")
    if case == "nan logits":
        pytest.importorskip("safetensors")
        monkeypatch.setattr(export_hf, "compare", lambda model, folder: (math.nan, 0.0))
    before = files()
    with pytest.raises(SystemExit) as e:
        export_hf.main(["--out_dir=out"] + [f"--to={to}"] * bool(to))
    assert str(e.value).startswith(f"error: {message}") and "\n" not in str(e.value), e.value
    assert (files() == before) != (case == "nan logits")   # that one is written first


@pytest.mark.parametrize("entry", entries(), ids="-".join)   # models: as helpers builds them
def test_every_table_entry_exports_its_logits_or_is_refused_in_one_sentence(entry, monkeypatch):
    """Refused only for what Llama has not (a vector after a Norm but Qwen3's q/k norms, DNP,
    post_norm, an MoE FFN); a copy of the placement under a new name alike, under one reparam."""
    monkeypatch.setitem(model_py.PLACEMENTS, "copy", model_py.PLACEMENTS[entry[1]])
    idx, qk = tokens(B=2, T=8), tuple(f".{m}.g" for m in export_hf.QK_NORMS)
    copies = models(entry[0], "copy") if entry[0] == next(iter(model_py.REPARAMS)) else []
    for label, kw in models(*entry) + copies:
        model = make(**kw)
        randomize_scale_vectors(model)
        c = model.config
        norm_after = c.scale_vectors and model_py.PLACEMENTS[c.sv_placement].norm
        try:
            config, state = export_hf.hf_export(model)
        except export_hf.ExportError as e:
            why = str(e)
            assert "\n" not in why and why.count(". ") == 0, why   # one sentence
            assert why.startswith(f"sv_placement={c.sv_placement!r} cannot") == bool(norm_after)
            assert (c.n_experts or c.post_norm or norm_after or any(
                sv.folds_into == model_py.AFTER_NORM and not n.endswith(qk)
                for n, sv in vectors(model).items())), f"{label}: refused: {e}"
            continue
        diff = (llama_forward(config, state, idx) - model(idx)[0].double()).abs().max().item()
        assert diff < 1e-4, (f"{label}: the export's logits are not the model's (by {diff:.3g}): "
                             + wrong_tensor(model, config, state))


def wrong_tensor(model, config, state):
    """Which of the export's embedding and head is not the folded model's, and the fix (a failing
    test's message): a vector folded into a weight the tied head shares needs the head untied."""
    plain, V = export_hf._fold(model).float(), model.config.vocab_size
    embedding = state["model.embed_tokens.weight"]
    head = state.get("lm_head.weight", embedding) * state["model.norm.weight"]
    on_tied = [n for n, s in model.vector_sites().items() if n != export_hf.FINAL_VECTOR
               and {export_hf.EMBEDDING, export_hf.HEAD} & {k for k, _ in s}]
    for name, got, want in (("model.embed_tokens.weight", embedding, plain.wte.weight[:V]),
                            ("the head", head, plain.head.weight[:V])):
        if not torch.allclose(got, want.detach(), atol=1e-5):
            gap = (got - want).abs().max().item()
            return f"{name} is {gap:.3g} away from the folded model's" + (
                f"; {on_tied} fold into the embedding or the head, which are tied: the export must "
                "untie them (export_hf.keeps_tie)" if config["tie_word_embeddings"] and on_tied
                else ": export_hf.hf_export must write the folded weights")
    return ("the embedding and head are right, so a block's weights are not "
            "(export_hf.BLOCK_WEIGHTS)")
