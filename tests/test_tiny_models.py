import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from memstate.cli import main
from memstate.tiny_models import tree_sha256


def test_tiny_models_are_byte_identical_across_runs(tmp_path):
    assert main(["tiny-models", "--out", str(tmp_path / "a")]) == 0
    assert main(["tiny-models", "--out", str(tmp_path / "b")]) == 0
    a, b = tree_sha256(tmp_path / "a"), tree_sha256(tmp_path / "b")
    assert {"policy/model.safetensors", "responder/model.safetensors", "policy/tokenizer.json"} <= set(a)
    assert a == b
    # policy and responder are different random models
    assert a["policy/model.safetensors"] != a["responder/model.safetensors"]


def test_tiny_models_are_qwen3_with_head_dim_64_and_chatml(tiny_models):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    tok = AutoTokenizer.from_pretrained(tiny_models["policy"])
    assert model.config.model_type == "qwen3" and model.config.head_dim == 64
    n_params = sum(p.numel() for p in model.parameters())
    assert 100_000 < n_params < 1_000_000
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tok.eos_token_id
    # byte-level BPE: any text round-trips, option letters are single tokens
    sample = "Zoë's café — naïve ✓ 1937"
    assert tok.decode(tok.encode(sample, add_special_tokens=False)) == sample
    assert all(len(tok.encode(x, add_special_tokens=False)) == 1 for x in "ABCD")
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode("hello")])).logits
    assert logits.shape[-1] == len(tok)
