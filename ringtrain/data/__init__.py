"""ringtrain.data"""
