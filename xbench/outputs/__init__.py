"""What a run shows: tables, figures, cross-metric analyses, exports and the HTML report."""
