"""Make the demo's tiny model and dataset offline (runs inside the training image).

usage: python make_assets.py OUT  ->  OUT/model (a random 2-layer Llama with its own byte-level
BPE tokenizer, about 150k parameters) and OUT/data (64 alpaca records + dataset_info.json).
Deterministic: the same seed gives the same files.
"""

import json
import random
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = [
    "node",
    "rank",
    "master",
    "address",
    "port",
    "network",
    "interface",
    "host",
    "bridge",
    "container",
    "docker",
    "nccl",
    "gloo",
    "training",
    "step",
    "loss",
    "checkpoint",
    "adapter",
    "gradient",
    "batch",
    "layer",
    "model",
    "token",
    "dataset",
    "firewall",
    "route",
    "packet",
    "socket",
    "peer",
    "cluster",
    "job",
    "config",
    "image",
    "volume",
    "shard",
    "optimizer",
    "learning",
    "rate",
]
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}


def records(count: int, rng: random.Random) -> list[dict]:
    out = []
    for i in range(count):
        topic = rng.sample(WORDS, 3)
        out.append(
            {
                "instruction": f"Explain how {topic[0]} relates to {topic[1]}.",
                "input": "" if i % 3 else f"Context: {topic[2]}.",
                "output": " ".join(rng.choice(WORDS) for _word in range(12 + i % 7)) + ".",
            }
        )
    return out


def portable(model_dir: Path) -> None:
    """Tokenizer files that older LLaMA-Factory stacks load too (0.9.0: transformers 4.44,
    tokenizers 0.19): the class by its 4.x name (5.x reads it as the same class), and the BPE
    merges as "a b" strings, the form tokenizers before 0.20 read and later versions still do."""
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    tokenizer_path = model_dir / "tokenizer.json"
    tokenizer = json.loads(tokenizer_path.read_text())
    merges = tokenizer["model"]["merges"]
    if merges and not isinstance(merges[0], str):
        if any(" " in part for pair in merges for part in pair):
            raise ValueError("a BPE merge holds a space: it has no string form")
        tokenizer["model"]["merges"] = [" ".join(pair) for pair in merges]
    tokenizer_path.write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False))


def main(out: Path) -> None:
    rng = random.Random(1234)  # noqa: S311 - reproducible sample data
    torch.manual_seed(1234)
    data = records(64, rng)
    (out / "data").mkdir(parents=True, exist_ok=True)
    (out / "data" / "alpaca_tiny.json").write_text(json.dumps(data, indent=1))
    (out / "data" / "dataset_info.json").write_text(
        json.dumps({"alpaca_tiny": {"file_name": "alpaca_tiny.json"}}, indent=1)
    )

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = list(SPECIAL.values())
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [" ".join(r.values()) for r in data] + [" ".join(WORDS)] * 4
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL)
    model_dir = out / "model"
    fast.save_pretrained(model_dir)
    portable(model_dir)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(model_dir)
    count = sum(p.numel() for p in model.parameters())
    print(f"model: {count} parameters in {model_dir}; data: {len(data)} records")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
