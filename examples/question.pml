<prompt schema="demo"><harbor/><style tone="plain"/><user>Who kept the Calder Light?</user></prompt>
