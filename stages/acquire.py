"""DVC stage `acquire`: pinned raw datasets -> data/raw (mirrors first, then upstream; sha256 verified)."""

from medrank.core import layout
from medrank.data.acquire import acquire
from medrank.params import load_params
from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path).acquire
    acquire(layout.RAW, p.mirrors, download=p.download, timeout_s=p.timeout_s)


if __name__ == "__main__":
    run(main)
