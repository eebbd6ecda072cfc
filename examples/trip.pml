<schema name="trip">
  <system>You plan trips.</system>                   <!-- chat roles use the model's own template -->
  <module name="plan">Plan a trip of <param name="days" len="6"/> in
    <union name="city">                               <!-- import at most one member -->
      <module name="paris">Paris: the Louvre, walks along the Seine, cafés in the Marais.</module>
      <module name="tokyo">Tokyo: temples in Asakusa, the Tsukiji outer market, and surf at Kamakura an hour away.</module>
    </union>
  </module>
  <module name="budget">Keep it under <param name="amount" len="4"/>.</module>
</schema>
