"""The MTL upper bound checked against an independent joint run (plain transformers + PEFT).

The independent run shares nothing with surecl's training code: it reads the CL_Benchmark
JSON files itself, builds the O-LoRA prompt as text, tokenises prompt + " " + label + EOS
without truncation, masks the prompt out of the labels, and trains with the model's own loss
(mean over the answer tokens of the batch) on uniform batches drawn from all tasks at once,
then answers by ``generate`` (greedy) and exact match after surecl's normalisation. Same base weights (the embedded
SmolLM2-135M, fp32), LoRA r 8 / alpha 32 / dropout 0.1 on q_proj, v_proj, AdamW.

Usage (from the repository root):
  python bench/mtl_check.py --benchmark ../shared/benchmarks/CL_Benchmark --tasks dbpedia,SST-2,agnews \
      --n-train 200 --n-test 100 --lr 5e-4 --batch 8 --seed 0
Prints the plain run's per-task accuracy and FP; compare with
  surecl run --config mtl data.benchmark=... data.tasks=[dbpedia,SST-2,agnews] data.n_train=200 \
      data.n_test=100 train.lr=5e-4 model.dtype=fp32 [model.max_length=512] [train.batching=uniform]
(the test examples differ between the two samplers; the comparison is of FP levels).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from common import script
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from surecl.config import ModelConfig
from surecl.evaluate import normalise  # the same answer matching as surecl's accuracy
from surecl.model import load_model


def read_task(root: Path, name: str) -> tuple[str, list[str], list[dict], list[dict]]:
    folder = next(p for p in root.glob(f"*/{name}") if p.is_dir())
    instructions = json.loads((root / "instruction_config.json").read_text())
    group = folder.parent.name
    instruction = instructions[group][0]["instruction"] if isinstance(instructions[group], list) else instructions[group]
    labels = json.loads((folder / "labels.json").read_text())
    load = lambda split: [r for r in json.loads((folder / f"{split}.json").read_text()) if r["label"] in labels]  # noqa: E731
    return instruction, labels, load("train"), load("test")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--tasks", default="dbpedia,SST-2,agnews")
    ap.add_argument("--n-train", type=int, default=200)
    ap.add_argument("--n-test", type=int, default=100)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    path = load_model(ModelConfig(dtype="fp32"), torch.device("cpu")).path  # the embedded weights, converted once
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=32, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    train, tests = [], {}
    for name in args.tasks.split(","):
        instruction, labels, tr, te = read_task(Path(args.benchmark), name)
        prompt = lambda s, i=instruction, labs=labels: i + "Option: " + ", ".join(labs) + " \n" + s + "\nAnswer:"  # noqa: E731
        train += [(prompt(r["sentence"]), r["label"]) for r in rng.sample(tr, min(args.n_train, len(tr)))]
        tests[name] = ([(prompt(r["sentence"]), r["label"]) for r in rng.sample(te, min(args.n_test, len(te)))], labels)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    model.train()
    start = time.perf_counter()
    steps = 0
    for _ in range(args.epochs):
        rng.shuffle(train)
        for k in range(0, len(train), args.batch):
            rows = train[k : k + args.batch]
            ids, labs = [], []
            for p, y in rows:
                pi = tok(p, add_special_tokens=False)["input_ids"]
                ai = tok(" " + y, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                ids.append(pi + ai)
                labs.append([-100] * len(pi) + ai)
            width = max(map(len, ids))
            input_ids = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in ids])
            labels = torch.tensor([[-100] * (width - len(x)) + x for x in labs])
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            opt.step()
            opt.zero_grad()
            steps += 1
    train_s = time.perf_counter() - start
    model.eval()
    accs = {}
    with torch.no_grad():
        for name, (rows, labels) in tests.items():
            new = max(len(tok(" " + y, add_special_tokens=False)["input_ids"]) for y in labels) + 1
            right = 0
            for k in range(0, len(rows), 32):
                part = rows[k : k + 32]
                enc = tok([p for p, _ in part], return_tensors="pt", padding=True, add_special_tokens=False)
                out = model.generate(**enc, max_new_tokens=new, do_sample=False, pad_token_id=tok.pad_token_id)
                for (_, y), seq in zip(part, out[:, enc["input_ids"].shape[1] :]):
                    right += normalise(tok.decode(seq, skip_special_tokens=True)) == normalise(y)
            accs[name] = 100.0 * right / len(rows)
    fp = sum(accs.values()) / len(accs)
    print(json.dumps({"plain_joint": accs, "fp": round(fp, 2), "steps": steps, "train_s": round(train_s, 1), **vars(args)}))


if __name__ == "__main__":
    script(main)
