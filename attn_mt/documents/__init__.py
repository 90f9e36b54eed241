"""Documents: a paragraph's sentences, lines translated as their sentences, HTML with its markup."""
