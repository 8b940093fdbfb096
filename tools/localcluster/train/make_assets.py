"""Make the demo's tiny model and dataset offline (runs inside the training image).

usage: python make_assets.py OUT  ->  OUT/model (a random 2-layer Llama with its own byte-level
BPE tokenizer, about 140k parameters) and OUT/data (64 alpaca records: 8 fixed question/answer
pairs, 8 times each, + dataset_info.json).
Deterministic: the same seed gives the same files.
"""

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# Eight fixed questions with short answers, each repeated 8 times: records a tiny model can
# learn in the demo's 12 steps (random sentences would leave the loss at a guess's, ln(vocab)).
PAIRS = [
    ("Which backend do CPU ranks use?", "gloo"),
    ("Which backend do GPU ranks use?", "nccl"),
    ("Which port does the master listen on?", "29500"),
    ("Which NIC does a GCP VM use?", "ens4"),
    ("Which rank is the master?", "rank 0"),
    ("Which ZeRO stage shards the parameters?", "stage 3"),
    ("What does LoRA train?", "the adapter"),
    ("Which network fails between VMs?", "the docker bridge"),
]
RECORDS = 64
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
HIDDEN = 64
# LoRA never trains the output layer, and the final RMSNorm holds the hidden state at length
# sqrt(HIDDEN): at the usual init (std 0.02) no logit can pass about 1.3, so the loss could
# never fall far below ln(vocab). This std gives a random hidden state logits of std about 1.5
# (a first loss near ln(vocab) still) and an adapter room for logits of about 12.
OUTPUT_STD = 1.5 / HIDDEN**0.5


def records(count: int) -> list[dict]:
    return [
        {"instruction": question, "input": "", "output": answer}
        for question, answer in (PAIRS[i % len(PAIRS)] for i in range(count))
    ]


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
    torch.manual_seed(1234)
    data = records(RECORDS)
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
    # The pieces as LLaMA-Factory's default template encodes them, one by one.
    corpus = ["\nAssistant:"] + [
        piece for pair in PAIRS for piece in (f"Human: {pair[0]}", pair[1])
    ]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL)
    model_dir = out / "model"
    fast.save_pretrained(model_dir)
    portable(model_dir)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, OUTPUT_STD)
    model.save_pretrained(model_dir)
    count = sum(p.numel() for p in model.parameters())
    print(f"model: {count} parameters in {model_dir}; data: {len(data)} records")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
