"""LoRA federation: the low-rank algebra, rounds across clusters and the hash-chained ledger of rounds."""
