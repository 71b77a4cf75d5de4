"""Distributed training under the engine: DDP's graph split at gradient-bucket boundaries
(bucket_split.py), DDP modules in compiled code (ddp.py), collectives in user code
(collectives.py). The engine runs inside each rank; torch.distributed does the rest."""
