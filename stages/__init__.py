"""The pipeline's stages (`python -m stages.<name>`, dvc.yaml). Importing medrank first sets the process-wide
settings that must precede torch (OMP_WAIT_POLICY, medrank/__init__.py), whatever a stage module imports first."""

import medrank  # noqa: F401
