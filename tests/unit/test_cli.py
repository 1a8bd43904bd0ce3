from hami.cli import COMMANDS, main


def test_unknown_command_exits_nonzero(capsys):
    try:
        code = main(["no-such-command"])
    except SystemExit as exc:
        code = exc.code
    assert code != 0


def test_every_command_names_a_module():
    for name, (module, help_text) in COMMANDS.items():
        assert module.startswith("hami."), name
        assert help_text
