"""The model zoo: real transformers models, tiny configs, random init, run eagerly and
compiled (engine or torch.compile) and compared. Registry: models.py; runner: runner.py
(`python -m tests.zoo --help`)."""
