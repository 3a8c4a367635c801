"""python -m ringtree COMMAND ...: see ringtree/commands/."""

from .commands import run_from_shell

if __name__ == "__main__":
    run_from_shell()
