"""DVC stage `acquire`: pinned raw datasets -> data/raw (mirrors first, then upstream; sha256 verified)."""

from medrank.data.acquire import acquire
from medrank.params import load_params
from medrank.runner import run


def main() -> None:
    p = load_params().acquire
    acquire(p.out_dir, p.mirrors, download=p.download, timeout_s=p.timeout_s)


if __name__ == "__main__":
    run(main)
