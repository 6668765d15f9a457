from phrase_scorer.cli import main

main()
