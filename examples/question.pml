<prompt schema="demo"><style tone="plain"/><harbor/><user>Who kept the Calder Light?</user></prompt>
