"""What both families' replays share: array and compiled-code helpers, the judgement, the outcome records."""
