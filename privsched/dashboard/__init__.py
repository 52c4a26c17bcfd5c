"""The web dashboard and Prometheus metrics: what a privacy officer or platform team looks at.

``bars`` reduces a block's budget vectors to the fractions a stacked bar shows, ``views``
assembles the JSON the pages poll, ``metrics`` exports the ledger in Prometheus' format,
``figure`` draws the same bars to a PNG, and ``routes`` serves all of it over HTTP.
"""
