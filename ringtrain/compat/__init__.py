"""ringtrain.compat"""
