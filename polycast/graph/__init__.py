"""Graph and topology: the trees algorithms are built on (NCCL's binary and double binary
trees, binomial trees, hierarchical host/rank patterns)."""
