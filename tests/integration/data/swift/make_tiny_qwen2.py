"""A tiny Qwen2 model, tokenizer and chat dataset made from nothing (no hub): run inside the stack image.

usage: python make_tiny_qwen2.py OUT_DIR
  ->  OUT_DIR/model (~140 KB), OUT_DIR/train.jsonl (SFT messages), OUT_DIR/dpo.jsonl (+ rejected_response)
"""

import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QUESTIONS = ["what is two plus two", "name a colour", "say hello", "count to three", "what is the sky",
             "name an animal", "what day follows monday", "spell cat"]
ANSWERS = ["four", "blue", "hello", "one two three", "the sky is blue", "a cat", "tuesday", "c a t"]
WRONG = ["five", "table", "goodbye", "three", "the sky is green", "a chair", "sunday", "d o g"]


def main(out: str) -> None:
    torch.manual_seed(0)
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for _ in range(8) for q, a in zip(QUESTIONS, ANSWERS)]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(out, "dpo.jsonl"), "w") as f:
        f.writelines(json.dumps({**r, "rejected_response": WRONG[i % len(WRONG)]}) + "\n" for i, r in enumerate(rows))

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = QUESTIONS + ANSWERS + WRONG + ["system user assistant You are a helpful assistant."]
    tok.train_from_iterator(corpus * 4, trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL[1:])
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    model_dir = os.path.join(out, "model")
    fast.save_pretrained(model_dir)

    config = Qwen2Config(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, bos_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    print(f"tiny qwen2: {sum(os.path.getsize(os.path.join(model_dir, n)) for n in os.listdir(model_dir))} bytes "
          f"in {model_dir}, {len(rows)} rows in {out}/train.jsonl")


if __name__ == "__main__":
    main(sys.argv[1])
