"""ringtrain.serve"""
