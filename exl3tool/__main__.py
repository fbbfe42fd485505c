from exl3tool.cli.main import main

main()
