"""LoRA from the YAML's fields: adapters train, and the merged export is a plain model that loads and generates."""

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from memstate.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_lora_run_exports_a_merged_model(tiny_models, fever_data, tmp_path):
    out = tmp_path / "lora"
    assert main([
        "train", "--config", str(ROOT / "configs/train/tiny_cpu.yaml"),
        "--policy_model", str(tiny_models["policy"]), "--responder_model", str(tiny_models["responder"]),
        "--data_dir", str(fever_data), "--output_dir", str(out), "--report_to", "none",
        "--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--learning_rate", "0.005",
        "--lora_modules_to_save", "lm_head",
        "--max_steps", "4", "--save_steps", "4", "--eval_steps", "4",
    ]) == 0  # fmt: skip
    adapter = json.loads((out / "final-adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["lora_alpha"] == 16 and "q_proj" in adapter["target_modules"]
    assert adapter["modules_to_save"] == ["lm_head"]
    merged = AutoModelForCausalLM.from_pretrained(out / "final")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base = AutoModelForCausalLM.from_pretrained(out / "format-warmup")
    merged_params = dict(merged.named_parameters())
    deltas = [(merged_params[k] - v).abs().max().item() for k, v in base.named_parameters() if k in merged_params]
    assert len(deltas) == len(list(base.parameters()))
    assert max(deltas) > 0  # the adapters were trained and merged into the weights
    # lm_head was trained in full (modules_to_save): the export unties it from the embeddings
    assert not merged.config.tie_word_embeddings
    assert (merged.lm_head.weight - merged.model.embed_tokens.weight).abs().max() > 0
    tok = AutoTokenizer.from_pretrained(out / "final")
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)  # fmt: skip
    with torch.no_grad():
        gen = merged.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.shape[1] > ids["input_ids"].shape[1]
