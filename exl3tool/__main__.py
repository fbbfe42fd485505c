from exl3tool.cli import entry

entry()
