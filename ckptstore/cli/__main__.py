"""``python -m ckptstore.cli`` runs the ``ckptstore`` command."""

from ckptstore.cli.main import main

if __name__ == "__main__":
    main()
