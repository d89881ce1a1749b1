"""What crosses processes: the layout hint, the padded layout, and the layout arithmetic both sides share."""
