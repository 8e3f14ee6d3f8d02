"""A tiny megatron-core GPT (4 layers, hidden 256) trained with tensor parallelism over every rank on mock data,
for `benchmarks/gpu_e2e.sh`: rank 0 prints `iteration N loss X` and the loss must fall. The toy task (the next
token is the current one plus one) is learnable, so a falling loss shows the forward, backward and TP
collectives all work. Needs torch with CUDA and megatron-core (no apex or TransformerEngine: local layers)."""

import os

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig

VOCAB, SEQ, BATCH, ITERS = 1024, 64, 8, int(os.environ.get("ITERS", "30"))


def main() -> None:
    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    world = torch.distributed.get_world_size()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world, pipeline_model_parallel_size=1)
    model_parallel_cuda_manual_seed(123)
    config = TransformerConfig(num_layers=4, hidden_size=256, num_attention_heads=8, use_cpu_initialization=True,
                               pipeline_dtype=torch.float32)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                     max_sequence_length=SEQ).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    position_ids = torch.arange(SEQ, device="cuda").unsqueeze(0).expand(BATCH, -1)
    mask = torch.tril(torch.ones(SEQ, SEQ, device="cuda")).view(1, 1, SEQ, SEQ) < 0.5  # True = masked
    rank = torch.distributed.get_rank()
    for it in range(ITERS):
        g = torch.Generator().manual_seed(it)  # the same batch on every tensor-parallel rank
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).cuda()
        loss = model(tokens, position_ids, mask, labels=(tokens + 1) % VOCAB).float().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"iteration {it + 1} loss {loss.item():.4f} (tensor parallel {world})", flush=True)
    torch.distributed.barrier()
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
