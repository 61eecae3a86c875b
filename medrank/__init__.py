"""medrank: filter and re-rank answers to consumer health questions."""

__version__ = "0.1.0"
